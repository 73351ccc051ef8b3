#!/usr/bin/python3
"""gpuinfra-active-checks: prove this GPU node can compute and move data before it takes jobs.

The admission gate (gpuinfra's gpu_admission module, on the Slurm controller) runs it as a Slurm job on a node it
holds out of service. It runs the active checks the cluster file names, each tool with a time limit and a bounded
output, and judges their outputs with the collection's parsers (active_checks.py, installed beside it) against the
floors of the node's GPU model:
- dcgm_diag: `dcgmi diag -r LEVEL -j`;
- nccl_all_reduce: nccl-tests' `all_reduce_perf` over the node's GPUs (a one-GPU node has nothing to judge);
- host_bandwidth: nvbandwidth's host <-> device copies, each GPU against the floor.

It prints one line per check, or with --json one document: the verdict (pass, fail or unknown: a tool missing,
hung or printing what it does not print), the reason a drain would carry, and each check's figures. It writes the
same to the node exporter's textfile folder and keeps the last result in its state folder. It changes nothing in
the scheduler: the gate decides.

Exit codes: 0 pass, 1 fail, 2 it could not run (bad configuration), 3 unknown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

LIBRARY = "/usr/local/lib/gpuinfra"
CONFIG = "/etc/gpuinfra/health.json"
EXIT = {"pass": 0, "fail": 1, "unknown": 3}

sys.path.insert(0, LIBRARY)
from gpuinfra_node.active_checks import (  # noqa: E402
    FAIL,
    MAX_OUTPUT_BYTES,
    PASS,
    PREFIX,
    RESULT,
    UNKNOWN,
    CheckResult,
    judge_all_reduce,
    judge_dcgm_diag,
    judge_host_bandwidth,
)


class Failure(Exception):
    """The program cannot run: its settings are missing or wrong."""


def run_tool(argv: list[str], timeout: int) -> tuple[bytes | None, int | None, str]:
    """The tool's stdout (None when it could not run), exit status and why it could not. Output past the parsers'
    limit is cut there (the parser then says it is too long): a tool printing without end cannot fill memory."""
    if not os.access(argv[0], os.X_OK):
        return None, None, f"{argv[0]} is not installed"
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None, None, f"{os.path.basename(argv[0])} did not finish within {timeout} s"
        except OSError as exc:
            return None, None, f"{os.path.basename(argv[0])} could not start: {exc.strerror}"
        out.seek(0)
        return out.read(MAX_OUTPUT_BYTES + 1), done.returncode, ""


def unknown(check: str, what: str, why: str) -> CheckResult:
    return CheckResult(check, UNKNOWN, f"{PREFIX}: {what} could not be judged: {why}"[:240])


def dcgm_diag(settings: dict[str, Any], gpus: int, timeout: int) -> CheckResult:
    level = int(settings["dcgm_level"])
    output, rc, why = run_tool([settings["tools"]["dcgmi"], "diag", "-r", str(level), "-j"], timeout)
    if output is None:
        return unknown("dcgm_diag", f"dcgm diag -r {level}", why)
    return judge_dcgm_diag(output, level=level, rc=rc, prefix=PREFIX)


def nccl_all_reduce(settings: dict[str, Any], gpus: int, timeout: int) -> CheckResult | None:
    if gpus < 2:
        return None  # one rank moves nothing: busbw is 0 by definition, neither a pass nor a fail
    floor = settings["nccl_floor"]
    argv = [settings["tools"]["all_reduce_perf"], "-b", "1M", "-e", "1G", "-f", "2", "-g", str(gpus)]
    output, rc, why = run_tool(argv, timeout)
    if output is None:
        return unknown("nccl_all_reduce", "nccl all_reduce", why)
    return judge_all_reduce(output, float(floor["gbps"]), str(floor["of"]), expected_ranks=gpus, rc=rc, prefix=PREFIX)


def host_bandwidth(settings: dict[str, Any], gpus: int, timeout: int) -> CheckResult:
    floor = settings["host_floor"]
    argv = [settings["tools"]["nvbandwidth"], "-t", "host_to_device_memcpy_ce", "device_to_host_memcpy_ce"]
    output, rc, why = run_tool(argv, timeout)
    if output is None:
        return unknown("nvbandwidth", "nvbandwidth host<->device", why)
    return judge_host_bandwidth(
        output, float(floor["gbps"]), str(floor["of"]), expected_gpus=gpus, rc=rc, prefix=PREFIX
    )


CHECKS = {"dcgm_diag": dcgm_diag, "nccl_all_reduce": nccl_all_reduce, "host_bandwidth": host_bandwidth}


def settings_of(path: str) -> tuple[dict[str, Any], int, str]:
    """The `active` settings, the node's GPU count and the node exporter's textfile path (empty: none)."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        settings, gpus, textfile = config["active"], int(config["gpus"]), str(config.get("textfile", ""))
        unknown_checks = sorted(set(settings["checks"]) - set(CHECKS))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Failure(f"cannot read the active checks' settings in {path}: {exc!r}") from exc
    if unknown_checks:
        raise Failure(f"{path} names checks this program does not know: {', '.join(unknown_checks)}")
    return settings, gpus, textfile


def run_checks(settings: dict[str, Any], gpus: int) -> dict[str, Any]:
    """Every named check in turn; the verdict is the worst of theirs (fail, then unknown), and the reason that of
    the first failing check, else the first that could not be judged, else the list of what passed."""
    timeout = int(settings["timeout"])
    results = [r for name in settings["checks"] if (r := CHECKS[name](settings, gpus, timeout)) is not None]
    worst = next((v for v in (FAIL, UNKNOWN) if any(r.verdict == v for r in results)), PASS)
    if worst == PASS:
        reason = f"{PREFIX}: passed " + ", ".join(r.reason.split(": ", 1)[1] for r in results)
    else:
        reason = next(r.reason for r in results if r.verdict == worst)
    return {
        "verdict": worst,
        "reason": reason[:240],
        "finished": round(time.time(), 3),
        "checks": [{"check": r.check, "verdict": r.verdict, "reason": r.reason, "figures": r.figures} for r in results],
    }


def write_atomically(path: str, text: str, mode: int = 0o644) -> None:
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return  # no node exporter, or no state folder yet: nothing to keep it in
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def metrics(result: dict[str, Any]) -> str:
    """For the node exporter's textfile collector: each check's last verdict and when the checks ended."""
    lines = [
        "# HELP gpuinfra_active_check_passed The active check's last verdict: 1 pass, 0 fail or unknown.",
        "# TYPE gpuinfra_active_check_passed gauge",
        *(
            f'gpuinfra_active_check_passed{{check="{c["check"]}"}} {int(c["verdict"] == PASS)}'
            for c in result["checks"]
        ),
        "# HELP gpuinfra_active_check_unknown 1: the active check could not judge the node.",
        "# TYPE gpuinfra_active_check_unknown gauge",
        *(
            f'gpuinfra_active_check_unknown{{check="{c["check"]}"}} {int(c["verdict"] == UNKNOWN)}'
            for c in result["checks"]
        ),
        "# HELP gpuinfra_active_checks_last_run_timestamp_seconds When the node's active checks last ended.",
        "# TYPE gpuinfra_active_checks_last_run_timestamp_seconds gauge",
        f"gpuinfra_active_checks_last_run_timestamp_seconds {result['finished']:.3f}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuinfra-active-checks", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help=f"settings (default {CONFIG})")
    parser.add_argument("--result", default=RESULT, help=f"where the last result is kept (default {RESULT})")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")
    args = parser.parse_args(argv)
    try:
        settings, gpus, textfile = settings_of(args.config)
    except Failure as exc:
        print(f"gpuinfra-active-checks: {exc}", file=sys.stderr)
        return 2
    result = run_checks(settings, gpus)
    write_atomically(args.result, json.dumps(result, sort_keys=True) + "\n", 0o600)
    if textfile:
        write_atomically(os.path.join(os.path.dirname(textfile), "gpuinfra_active_checks.prom"), metrics(result))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"gpuinfra-active-checks: {result['verdict']}: {result['reason']}")
        print("".join(f"  {c['check']}: {c['verdict']}: {c['reason']}\n" for c in result["checks"]), end="")
    return EXIT[result["verdict"]]


if __name__ == "__main__":
    sys.exit(main())
