"""The reports as text: aligned tables for people, CSV for spreadsheets. (JSON is each report's `as_dict`.)"""

from __future__ import annotations

from collections.abc import Sequence

from .idle import IdleReport
from .usage import GROUPINGS, GroupUsage, UsageReport, hours

# A spreadsheet runs a cell that starts with one of these as a formula (a tab or carriage return starts one too).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

CSV_COLUMNS = ("by", "name", "jobs", "gpu_hours", "gpu_hours_measured", "mean_util_pct", "mean_fb_used_mib", "note")


def _csv_cell(value: object) -> str:
    """One cell as RFC 4180 writes it: quoted when its text holds the delimiter, the quote, a CR or a LF, on every
    Python (csv before 3.12.3 left a lone CR unquoted when the line ends in LF, which a reader then splits)."""
    text = "" if value is None else str(value)  # as csv writes None
    if isinstance(value, str) and text.startswith(FORMULA_STARTS):
        text = "'" + text
    return '"' + text.replace('"', '""') + '"' if any(char in text for char in ',"\r\n') else text


def _csv(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """CSV where every text cell stays a text: one a spreadsheet would run as a formula (an account named
    `=HYPERLINK(...)`) gets a leading `'`, which spreadsheets show as text and do not print."""
    return "".join(",".join(_csv_cell(cell) for cell in row) + "\n" for row in [header, *rows])


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell, two spaces apart; the columns in `right` right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(cell).rjust(width) if index in right else str(cell).ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _group_rows(groups: Sequence[GroupUsage], report: UsageReport) -> list[list[str]]:
    """Name, jobs, GPU-hours, mean utilisation and memory; where there is no utilisation, the reason (once in the
    header when it is not collected at all, else per row)."""
    missing = "n/a" if report.not_collected else "n/a (no GPU metrics for these jobs)"
    return [
        [
            group.name,
            str(group.jobs),
            f"{hours(group.gpu_seconds):.2f}",
            missing if group.mean_util_pct is None else f"{group.mean_util_pct:.1f}%",
            "n/a" if group.mean_fb_used_mib is None else f"{group.mean_fb_used_mib:.0f} MiB",
        ]
        for group in groups
    ]


def usage_table(report: UsageReport) -> str:
    window = report.window.as_dict()
    out = [f"GPU usage from {window['since']} to {window['until']}\n"]
    if report.not_collected:
        out.append(f"GPU utilisation: {report.not_collected}\n")
    if not report.jobs:
        out.append("\nNo job held a GPU in this window.\n")
    for name, key, _ in GROUPINGS:
        if not report.jobs:
            break
        header = [key.upper(), "JOBS", "GPU-HOURS", "MEAN UTIL", "MEAN MEM USED"]
        out.append("\n" + table(header, _group_rows(report.groups(name), report), right=(1, 2)))
    if report.jobs:
        total = report.total()
        line = f"\n{total.jobs} job(s), {hours(total.gpu_seconds):.2f} GPU-hours"
        if not report.not_collected:
            line += f", {hours(total.measured_seconds):.2f} of them with GPU metrics"
        out.append(line + "\n")
    for error in report.errors:
        out.append(f"error: {error}\n")
    return "".join(out)


def usage_csv(report: UsageReport) -> str:
    rows = []
    for name, key, _ in GROUPINGS:
        for group in report.groups(name):
            row = group.as_dict(key, report.not_collected)
            rows.append(
                [
                    key,
                    group.name,
                    group.jobs,
                    row["gpu_hours"],
                    row["gpu_hours_measured"],
                    "" if row["mean_util_pct"] is None else row["mean_util_pct"],
                    "" if row["mean_fb_used_mib"] is None else row["mean_fb_used_mib"],
                    row["util_note"] or "",
                ]
            )
    return _csv(CSV_COLUMNS, rows)


IDLE_CSV_COLUMNS = ("job_id", "user", "account", "partition", "gpus", "idle_gpus", "idle_minutes", "at_least")


def idle_table(report: IdleReport) -> str:
    rule = report.rule
    out = [
        f"Running jobs with GPUs below {rule.threshold_pct:g}% utilisation for at least {rule.for_s // 60} min "
        "(the GpuIdleWhileAllocated alert's rule)\n"
    ]
    if report.jobs:
        rows = [
            [
                job.job.job_id,
                job.job.user,
                job.job.account,
                job.job.partition,
                str(job.job.gpus),
                str(len(job.gpus)),
                f"{'>=' if job.at_least else ''}{job.idle_minutes}",
            ]
            for job in report.jobs
        ]
        header = ["JOB", "USER", "ACCOUNT", "PARTITION", "GPUS", "IDLE GPUS", "MINUTES IDLE"]
        out.append("\n" + table(header, rows, right=(4, 5, 6)))
    else:
        out.append("\nNo running job has an idle GPU.\n")
    for gpu in report.unknown:
        out.append(f"idle GPU {gpu.gpu} carries job {gpu.job_id}, which Slurm does not list as running\n")
    return "".join(out)


def idle_csv(report: IdleReport) -> str:
    rows = [
        [job.job.job_id, job.job.user, job.job.account, job.job.partition, job.job.gpus, len(job.gpus),
         job.idle_minutes, job.at_least]
        for job in report.jobs
    ]  # fmt: skip
    return _csv(IDLE_CSV_COLUMNS, rows)
