# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The active GPU checks' outputs read and judged: DCGM diagnostics (`dcgmi diag -r LEVEL -j`), nccl-tests'
`all_reduce_perf` and nvbandwidth's host <-> device memcpy tests.

Standard library only, Python 3.9 or newer, no I/O: it runs on managed hosts (the node-side check program) and on
the controller (tests, sweeps). It cannot import gpuinfra, so the floors are arguments: gpuinfra/catalog.py holds them
per GPU model (`nccl_all_reduce_floor`, `host_bandwidth_floor`).

What a host prints is data: every output is size-bounded, every field used is type-checked here, and output that is
not what the tool prints gives the verdict "unknown" with a sentence saying why, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
PREFIX = "gpuinfra admission"
# Where gpuinfra-active-checks keeps the node's last result, which gpuinfra-health reads.
RESULT = "/var/lib/gpuinfra-health/active-checks.json"


def admission_reservation(node: str) -> str:
    """The Slurm reservation the admission gate holds a node in while it checks it: while it exists, the node's last
    result is about to be replaced, and the gate judges the new one itself."""
    return f"gpuinfra-admission-{node}"


# Far above what a real run prints (an 8-GPU `dcgmi diag -r 4 -j` is tens of KiB): more is not that tool's output.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
MAX_GPUS = 256  # columns of an nvbandwidth matrix, ranks of an all-reduce on one node
MAX_REASON = 240  # Slurm keeps a drain reason in full; a short one stays readable in `sinfo -R`
MAX_MESSAGE = 160  # one DCGM warning's text, as carried into a reason

# ASCII digits only: Python's \d, int() and float() also take other scripts' digits, which no tool prints.
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_COUNT = re.compile(r"^[0-9]{1,19}$")


class ActiveCheckError(Exception):
    """Output that cannot be judged. The message is a sentence for the operator."""


@dataclass(frozen=True)
class CheckResult:
    """One check's judgement. `reason` is one line, prefixed, fit for a Slurm drain reason; `failures` has every
    failing item (a DCGM test on a GPU, a GPU's copy direction), one line each; `figures` the measured values."""

    check: str
    verdict: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: tuple[str, ...] = ()


# --- shared -----------------------------------------------------------------------------------------------------


def _text(output: str | bytes) -> str:
    if len(output) > MAX_OUTPUT_BYTES:
        unit = "bytes" if isinstance(output, bytes) else "characters"
        raise ActiveCheckError(
            f"the output has {len(output)} {unit}, more than the {MAX_OUTPUT_BYTES} a real run prints"
        )
    if isinstance(output, bytes):
        return output.decode("utf-8", errors="replace")
    return output


def _clean(text: str, limit: int = MAX_MESSAGE) -> str:
    """One line of printable text: host-supplied messages go into a drain reason and a terminal, where a control
    character (C0, C1, a line or paragraph separator) would end the line or drive the terminal."""
    text = "".join(ch if ch.isprintable() else " " for ch in text[: limit * 4])
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _number(token: str) -> float | None:
    """A finite decimal number as the tools print them (no nan/inf, which float() would also accept)."""
    return float(token) if _NUMBER.match(token) else None


def _gbps(value: float) -> str:
    """A floor as written in the catalog (270, 18.9), without trailing zeros."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _reason(prefix: str, text: str) -> str:
    return _clean(f"{prefix}: {text}", MAX_REASON)


def _unknown(
    check: str, prefix: str, what: str, why: str, rc: int | None, figures: dict[str, Any] | None = None
) -> CheckResult:
    exited = f" (exit status {rc})" if rc not in (None, 0) else ""
    return CheckResult(check, UNKNOWN, _reason(prefix, f"{what} could not be judged{exited}: {why}"), figures or {})


def _more(items: list[str]) -> str:
    return items[0] + (f" (+{len(items) - 1} more)" if len(items) > 1 else "")


# --- DCGM diagnostics: `dcgmi diag -r LEVEL -j` --------------------------------------------------------------------
# The JSON DCGM 4 prints (NVIDIA's dcgm_diag_schema.json): {"DCGM Diagnostic": {"test_categories": [{"category",
# "tests": [{"name", "results": [{"entity_group", "entity_group_id", "entity_id", "status", "warnings": [{"warning",
# "error_id", ...}]}], "test_summary": {"status", "warnings"}}]}]}, "entity_groups": [...], "metadata": {"version"}}.
# When the diagnostic cannot run, "DCGM Diagnostic" holds "runtime_error" instead. A test DCGM did not run has no
# results and no summary. Statuses are "Pass", "Fail", "Skip" and "Warn" (a pass with warnings).

_DCGM_STATUSES = {"pass", "fail", "skip", "warn"}


@dataclass(frozen=True)
class DcgmResult:
    test: str
    category: str
    entity: str | None
    """"GPU 1", or None for a test's summary."""
    status: str
    """Lower case: pass, fail, skip, warn, or whatever else DCGM wrote."""
    messages: tuple[str, ...]
    error_ids: tuple[int, ...]


@dataclass(frozen=True)
class DcgmReport:
    version: str | None
    runtime_error: str | None
    results: tuple[DcgmResult, ...]
    serials: dict[str, str]
    """Entity ("GPU 0") -> serial number, from entity_groups."""


def _field(obj: dict[str, Any], key: str, kind: Any, where: str, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    # bool is an int to Python, never to DCGM's JSON schema
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {str: "a string", int: "an integer", list: "a list", dict: "an object"}[kind]
        raise ActiveCheckError(f"{where}: {key!r} is not {expected}")
    return value


def _warnings(obj: dict[str, Any], where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    messages: list[str] = []
    ids: list[int] = []
    for i, item in enumerate(_field(obj, "warnings", list, where, required=False) or []):
        if not isinstance(item, dict):
            raise ActiveCheckError(f"{where}: warning {i} is not an object")
        messages.append(_clean(_field(item, "warning", str, f"{where} warning {i}")))
        error_id = _field(item, "error_id", int, f"{where} warning {i}", required=False)
        if error_id is not None:
            ids.append(error_id)
    return tuple(messages), tuple(ids)


def _entity(result: dict[str, Any], where: str) -> str:
    group = _clean(_field(result, "entity_group", str, where), 20)
    return f"{group} {_field(result, 'entity_id', int, where)}"


def parse_dcgm_diag(output: str | bytes) -> DcgmReport:
    """The results of `dcgmi diag -r LEVEL -j`, or ActiveCheckError naming what is not DCGM's JSON."""
    text = _text(output).strip()
    if not text:
        raise ActiveCheckError("dcgmi printed nothing")
    try:
        document = json.loads(text)
    except RecursionError:
        raise ActiveCheckError("the output nests deeper than any DCGM JSON") from None
    except ValueError as exc:  # JSONDecodeError, and lone surrogates
        raise ActiveCheckError(f"the output is not JSON ({_clean(str(exc), 80)})") from None
    if not isinstance(document, dict):
        raise ActiveCheckError("the output is JSON but not an object")
    if "DCGM GPU Diagnostic" in document:
        raise ActiveCheckError("this is DCGM 3's JSON ('DCGM GPU Diagnostic'): DCGM 4 or newer is needed")
    diagnostic = _field(document, "DCGM Diagnostic", dict, "the output")
    metadata = _field(document, "metadata", dict, "the output", required=False) or {}
    version = _field(metadata, "version", str, "metadata", required=False)
    version = version or _field(diagnostic, "version", str, "DCGM Diagnostic", required=False)
    runtime_error = _field(diagnostic, "runtime_error", str, "DCGM Diagnostic", required=False)
    results: list[DcgmResult] = []
    categories = _field(diagnostic, "test_categories", list, "DCGM Diagnostic", required=not runtime_error)
    for c, category in enumerate(categories or []):
        where = f"test category {c}"
        if not isinstance(category, dict):
            raise ActiveCheckError(f"{where} is not an object")
        category_name = _clean(_field(category, "category", str, where), 40)
        for t, test in enumerate(_field(category, "tests", list, where)):
            where = f"{category_name} test {t}"
            if not isinstance(test, dict):
                raise ActiveCheckError(f"{where} is not an object")
            name = _clean(_field(test, "name", str, where), 40)
            for r, result in enumerate(_field(test, "results", list, name, required=False) or []):
                where = f"{name} result {r}"
                if not isinstance(result, dict):
                    raise ActiveCheckError(f"{where} is not an object")
                status = _field(result, "status", str, where).strip().lower()
                messages, ids = _warnings(result, where)
                results.append(DcgmResult(name, category_name, _entity(result, where), status, messages, ids))
            summary = _field(test, "test_summary", dict, name, required=False)
            if summary is not None:
                messages, ids = _warnings(summary, f"{name} test_summary")
                status = _field(summary, "status", str, f"{name} test_summary").strip().lower()
                results.append(DcgmResult(name, category_name, None, status, messages, ids))
    serials: dict[str, str] = {}
    for g, group in enumerate(_field(document, "entity_groups", list, "the output", required=False) or []):
        if not isinstance(group, dict):
            raise ActiveCheckError(f"entity group {g} is not an object")
        group_name = _clean(_field(group, "entity_group", str, f"entity group {g}"), 20)
        for e, entity in enumerate(_field(group, "entities", list, f"entity group {g}")):
            if not isinstance(entity, dict):
                raise ActiveCheckError(f"entity group {g} entity {e} is not an object")
            serial = _field(entity, "serial_num", str, f"entity group {g} entity {e}", required=False)
            entity_id = _field(entity, "entity_id", int, f"entity group {g} entity {e}")
            if serial:
                serials[f"{group_name} {entity_id}"] = _clean(serial, 40)
    return DcgmReport(version and _clean(version, 40), runtime_error, tuple(results), serials)


def _test_statuses(results: tuple[DcgmResult, ...]) -> dict[str, str]:
    """Each test's status: its summary's, else (no summary: not in DCGM 4's output, cheap to allow) the worst of its
    entities' results."""
    rank = {"skip": 0, "pass": 1, "warn": 2}  # any other status, "fail" or unknown, outranks them
    out: dict[str, str] = {}
    for result in results:
        if result.entity is None:
            continue
        known = out.get(result.test)
        if known is None or (known in rank and rank.get(result.status, 9) > rank[known]):
            out[result.test] = result.status
    out.update({r.test: r.status for r in results if r.entity is None})
    return out


def judge_dcgm_diag(
    output: str | bytes, level: int | None = None, rc: int | None = None, prefix: str = PREFIX
) -> CheckResult:
    """pass, fail (each failing test and GPU named with DCGM's message) or unknown (could not run, or not DCGM's
    JSON). `rc` is dcgmi's exit status, which is not 0 when a test fails: the JSON decides, the status only explains
    output that cannot be read."""
    check = "dcgm_diag"
    what = f"dcgm diag -r {level}" if level is not None else "dcgm diag"
    try:
        report = parse_dcgm_diag(output)
    except ActiveCheckError as exc:
        return _unknown(check, prefix, what, str(exc), rc)
    figures: dict[str, Any] = {"dcgm_version": report.version, "level": level}
    if report.runtime_error is not None:
        first = next((line for line in report.runtime_error.splitlines() if line.strip()), "no message")
        figures["runtime_error"] = _clean(report.runtime_error)
        return _unknown(check, prefix, what, f"DCGM could not run it: {first}", rc, figures)
    tests = _test_statuses(report.results)
    failures: list[str] = []
    warnings: list[str] = []
    odd: list[str] = []
    failed_on_entity = {r.test for r in report.results if r.entity is not None and r.status == "fail"}
    for result in report.results:
        label = result.test if result.entity is None else f"{result.test} on {result.entity}"
        said = "; ".join(result.messages)
        if result.status == "fail":
            # A failed summary repeats its GPUs' failures: it is named alone only when no GPU carries one.
            if result.entity is not None or result.test not in failed_on_entity:
                failures.append(f"{label}: {said}" if said else label)
        elif result.status not in _DCGM_STATUSES:
            odd.append(f"{label}: status {_clean(result.status, 20)!r}")
        elif said:
            warnings.extend(f"{label}: {message}" for message in result.messages)
    figures.update(tests=tests, failures=failures, warnings=warnings[:20], serials=report.serials)
    if failures:
        return CheckResult(check, FAIL, _reason(prefix, f"{what} failed {_more(failures)}"), figures, tuple(failures))
    if odd:
        return _unknown(check, prefix, what, _more(odd), rc, figures)
    ran = [name for name, status in tests.items() if status in ("pass", "warn")]
    if not ran:
        why = "it reports no test that ran" if not tests else "every test was skipped"
        return _unknown(check, prefix, what, why, rc, figures)
    return CheckResult(check, PASS, _reason(prefix, f"{what} passed ({', '.join(ran)})"), figures)


# --- nccl-tests: all_reduce_perf -------------------------------------------------------------------------------
# Text: '#' lines are comments (arguments, one "#  Rank N ... device ..." line per rank, a column header), then one row
# per message size: size count type redop [root] then, out-of-place and in-place, time algbw busbw #wrong. Then
# "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth    : X" (GB/s) and "#". #wrong is "N/A" when the run
# did not check its data (-c 0). busbw = algbw * 2(n-1)/n over n ranks: one rank has nothing to judge.

_RANK = re.compile(r"^#\s*Rank\s+([0-9]{1,9})\b")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*([0-9]{1,19})\s*(OK|FAILED)?\s*$")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_NCCL_FAILURE = re.compile(r"Test (?:NCCL|CUDA) failure|NCCL WARN|Test failure", re.I)


@dataclass(frozen=True)
class AllReduceRow:
    size_bytes: int
    busbw_out_of_place: float
    busbw_in_place: float
    wrong: int | None
    """Corrupted elements in both runs of the row together; None when the data was not checked."""


@dataclass(frozen=True)
class AllReduceReport:
    ranks: int | None
    rows: tuple[AllReduceRow, ...]
    out_of_bounds: int
    avg_busbw: float


def _columns(line: str) -> list[str] | None:
    """The column names of the table's header ("size count type redop root time algbw busbw #wrong ..."), or None."""
    names = line.lstrip("#").split()
    if names[:2] == ["size", "count"] and names.count("busbw") == 2 and names.count("#wrong") == 2:
        return names
    return None


def _row(tokens: list[str], columns: list[str], line_no: int) -> AllReduceRow:
    if len(tokens) != len(columns):
        raise ActiveCheckError(f"line {line_no} has {len(tokens)} fields, the header {len(columns)}: a cut-off row")
    busbw = [i for i, name in enumerate(columns) if name == "busbw"]
    wrong = [i for i, name in enumerate(columns) if name == "#wrong"]
    measured = [i for i, name in enumerate(columns) if name in ("time", "cputime", "algbw", "busbw")]
    size = tokens[0]
    values = [_number(tokens[i]) for i in busbw]
    if not _COUNT.match(size) or any(_number(tokens[i]) is None or tokens[i].startswith("-") for i in measured):
        raise ActiveCheckError(f"line {line_no} is not a result row: {_clean(' '.join(tokens), 80)}")
    counts: list[int | None] = []
    for i in wrong:
        if tokens[i] == "N/A":
            counts.append(None)
            continue
        count = _number(tokens[i])  # printed with %g: 1e+06 for a million
        if count is None or count < 0:
            raise ActiveCheckError(f"line {line_no}: #wrong {_clean(tokens[i], 20)!r} is not a count")
        counts.append(int(count))
    known = [c for c in counts if c is not None]
    return AllReduceRow(int(size), values[0] or 0.0, values[1] or 0.0, sum(known) if known else None)


def parse_all_reduce(output: str | bytes) -> AllReduceReport:
    """The table and summary of `all_reduce_perf`, or ActiveCheckError saying what is missing."""
    lines = _text(output).splitlines()
    columns: list[str] | None = None
    ranks: set[int] = set()
    rows: list[AllReduceRow] = []
    out_of_bounds: int | None = None
    avg: float | None = None
    failure: str | None = None
    for line_no, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            rank = _RANK.match(stripped)
            if rank and len(ranks) < MAX_GPUS:
                ranks.add(int(rank.group(1)))
            columns = columns or _columns(stripped)
            oob = _OUT_OF_BOUNDS.match(stripped)
            if oob:
                out_of_bounds = int(oob.group(1)) if oob.group(2) != "FAILED" else max(1, int(oob.group(1)))
            mean = _AVG_BUSBW.match(stripped)
            if mean:
                avg = _number(mean.group(1))
                if avg is None:
                    raise ActiveCheckError(f"line {line_no}: the average bus bandwidth is not a number")
            continue
        if failure is None and _NCCL_FAILURE.search(stripped):
            failure = _clean(stripped, 120)
        tokens = stripped.split()
        # A row starts with its size; anything else (NCCL's INFO lines, a hostname) is not the table's.
        if columns is not None and tokens and _COUNT.match(tokens[0]) and out_of_bounds is None:
            rows.append(_row(tokens, columns, line_no))
    if columns is None:
        raise ActiveCheckError(failure or "no result table (the 'size count type ...' header is missing)")
    if not rows:
        raise ActiveCheckError(failure or "the result table has no row")
    if out_of_bounds is None or avg is None:
        missing = "'# Out of bounds values'" if out_of_bounds is None else "'# Avg bus bandwidth'"
        raise ActiveCheckError(failure or f"the output ends before its {missing} line")
    return AllReduceReport(len(ranks) or None, tuple(rows), out_of_bounds, avg)


def judge_all_reduce(
    output: str | bytes,
    floor_gbps: float,
    floor_of: str,
    min_bytes: int = 1 << 30,
    expected_ranks: int | None = None,
    rc: int | None = None,
    prefix: str = PREFIX,
) -> CheckResult:
    """The bus bandwidth at the largest message size against `floor_gbps` (the catalog's floor of `floor_of`, e.g.
    "H100-SXM5-80GB"), and the data check. The largest size must be at least `min_bytes`: smaller messages do not
    reach a link's bandwidth, and the floors are set for large ones. The average over all sizes is reported, not
    judged: small messages drag it down."""
    check, what = "nccl_all_reduce", "nccl all_reduce"
    try:
        report = parse_all_reduce(output)
    except ActiveCheckError as exc:
        return _unknown(check, prefix, what, str(exc), rc)
    largest = max(row.size_bytes for row in report.rows)
    at_largest = [row for row in report.rows if row.size_bytes == largest]
    # The out-of-place and in-place runs move the same data; the better one shows what the links can do.
    busbw = max(max(row.busbw_out_of_place, row.busbw_in_place) for row in at_largest)
    wrong = sum(row.wrong or 0 for row in report.rows)
    figures: dict[str, Any] = {
        "busbw_gbps": busbw,
        "size_bytes": largest,
        "avg_busbw_gbps": report.avg_busbw,
        "out_of_bounds": report.out_of_bounds,
        "wrong_elements": wrong,
        "ranks": report.ranks,
        "floor_gbps": floor_gbps,
    }
    if report.out_of_bounds or wrong:
        why = f"{what} returned corrupted data ({report.out_of_bounds} out-of-bounds results, {wrong} wrong elements)"
        return CheckResult(check, FAIL, _reason(prefix, why), figures, (why,))
    if all(row.wrong is None for row in report.rows):
        return _unknown(check, prefix, what, "it ran without checking its data (-c 0)", rc, figures)
    if report.ranks == 1:
        return _unknown(check, prefix, what, "one rank: a single GPU has no all-reduce bandwidth", rc, figures)
    if expected_ranks is not None and report.ranks != expected_ranks:
        why = f"it ran on {report.ranks or 'an unknown number of'} rank(s), the node has {expected_ranks} GPU(s)"
        return _unknown(check, prefix, what, why, rc, figures)
    if largest < min_bytes:
        why = f"its largest message is {largest} bytes, under the {min_bytes} its floor is set for"
        return _unknown(check, prefix, what, why, rc, figures)
    said = f"{what} busbw {busbw:.1f} GB/s"
    if busbw < floor_gbps:
        why = f"{said} below the {_gbps(floor_gbps)} GB/s floor of {floor_of}"
        return CheckResult(check, FAIL, _reason(prefix, why), figures, (why,))
    return CheckResult(check, PASS, _reason(prefix, f"{said}, floor {_gbps(floor_gbps)} GB/s of {floor_of}"), figures)


# --- nvbandwidth ------------------------------------------------------------------------------------------------
# Text: a header ("nvbandwidth Version: vX", "Driver Version: ...", "Device N: NAME (PCI)"), then per test
# "Running <test>." and its matrices: a title ("memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)"), a row of column
# labels, rows of values ("N/A" where nothing was measured), a blank line and "SUM <key> X", the key being the test's
# name (bidirectional tests print three matrices, keyed <test>_read1, _read2, _total). A test that cannot run on the
# node prints "Waived: " without its name; one that fails "Error: ...". Host <-> device tests have one row (the CPU)
# and one column per GPU.

HOST_TO_DEVICE = "host_to_device_memcpy_ce"
DEVICE_TO_HOST = "device_to_host_memcpy_ce"
_HOST_TESTS = {HOST_TO_DEVICE: "host_to_device", DEVICE_TO_HOST: "device_to_host"}
_RUNNING = re.compile(r"^Running (\w+)\.$")
_TITLE = re.compile(r"\((?:GB/s|ns)\)$")
_SUM = re.compile(r"^SUM (\w+) (\S+)$")
_DEVICE = re.compile(r"^Device ([0-9]{1,9}): (.*?)(?: \(([0-9a-fA-F:.]{1,32})\))?$")
_VERSION = re.compile(r"^nvbandwidth Version: (\S+)")


@dataclass(frozen=True)
class Matrix:
    key: str
    """Its SUM line's key: the test's name, or the test's name and a suffix."""
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[float | None, ...]], ...]
    total: float
    """The SUM line's value."""


@dataclass(frozen=True)
class NvbandwidthReport:
    version: str | None
    devices: dict[int, str]
    """Device index -> its PCI address as nvbandwidth prints it (00000000:18:00), where the header names it."""
    matrices: dict[str, Matrix]
    """By SUM key."""
    errors: dict[str, str]
    """Test -> the first error line printed while it ran."""


def _matrix(test: str, lines: list[str], i: int) -> tuple[Matrix, int]:
    """The matrix whose title is lines[i], printed by `test`, and the index after its SUM line."""
    title = lines[i].strip()
    if i + 1 >= len(lines):
        raise ActiveCheckError(f"{test}: the output ends after the matrix title")
    columns = tuple(lines[i + 1].split())
    if not columns or len(columns) > MAX_GPUS:
        raise ActiveCheckError(f"{test}: the matrix has {len(columns)} columns")
    rows: list[tuple[str, tuple[float | None, ...]]] = []
    i += 2
    while i < len(lines) and lines[i].strip() and len(rows) <= MAX_GPUS:
        tokens = lines[i].split()
        if tokens[0] == "SUM":
            break
        values = tuple(None if token == "N/A" else _number(token) for token in tokens[1:])
        bad = [token for token in tokens[1:] if token != "N/A" and _number(token) is None]
        if len(values) != len(columns) or bad:
            raise ActiveCheckError(f"{test}: row {_clean(lines[i], 60)!r} does not fit {len(columns)} column(s)")
        rows.append((tokens[0], values))
        i += 1
    if not rows:
        raise ActiveCheckError(f"{test}: the matrix has no row")
    while i < len(lines) and not lines[i].strip():
        i += 1
    summed = _SUM.match(lines[i].strip()) if i < len(lines) else None
    if summed is None or not summed.group(1).startswith(test):
        raise ActiveCheckError(f"{test}: the output ends before its 'SUM {test}' line")
    total = _number(summed.group(2))
    measured = sum(v for _, values in rows for v in values if v is not None)
    # Each value and the sum are printed to 2 decimals: more than rounding apart, a row is missing or mangled.
    if total is None or abs(total - measured) > 0.01 * (1 + sum(len(values) for _, values in rows)):
        raise ActiveCheckError(f"{test}: SUM {summed.group(2)!r} is not the sum of its matrix ({measured:.2f})")
    return Matrix(summed.group(1), title, columns, tuple(rows), total), i + 1


def parse_nvbandwidth(output: str | bytes) -> NvbandwidthReport:
    """Every matrix nvbandwidth printed, or ActiveCheckError naming the first one that is cut off or bent."""
    lines = _text(output).splitlines()
    version: str | None = None
    devices: dict[int, str] = {}
    matrices: dict[str, Matrix] = {}
    errors: dict[str, str] = {}
    test: str | None = None  # the one running
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        running = _RUNNING.match(line)
        if running:
            test = running.group(1)
        elif test is not None and _TITLE.search(line):
            matrix, i = _matrix(test, lines, i)
            matrices[matrix.key] = matrix
            continue
        elif test is not None and line.startswith(("Error", "ERROR")):
            errors.setdefault(test, _clean(line, 120))
        elif test is None:
            found = _VERSION.match(line)
            device = _DEVICE.match(line)
            if found:
                version = _clean(found.group(1), 40)
            elif device and device.group(3) and len(devices) < MAX_GPUS:
                devices[int(device.group(1))] = device.group(3)
        i += 1
    return NvbandwidthReport(version, devices, matrices, errors)


def judge_host_bandwidth(
    output: str | bytes,
    floor_gbps: float,
    floor_of: str,
    expected_gpus: int | None = None,
    rc: int | None = None,
    prefix: str = PREFIX,
) -> CheckResult:
    """Each GPU's host_to_device and device_to_host copy bandwidth against `floor_gbps` (the catalog's floor of
    `floor_of`, e.g. "L4 at PCIe Gen4"); the GPUs below it are named."""
    check, what = "nvbandwidth", "nvbandwidth host<->device"
    try:
        report = parse_nvbandwidth(output)
    except ActiveCheckError as exc:
        return _unknown(check, prefix, what, str(exc), rc)
    figures: dict[str, Any] = {"nvbandwidth_version": report.version, "floor_gbps": floor_gbps}
    figures["devices"] = {str(index): pci for index, pci in sorted(report.devices.items())}
    failures: list[tuple[float, str]] = []
    for test, direction in _HOST_TESTS.items():
        matrix = report.matrices.get(test)
        if matrix is None:
            why = f"no {test} result ({report.errors.get(test, 'waived, or not run')})"
            return _unknown(check, prefix, what, why, rc)
        if len(matrix.rows) != 1:
            return _unknown(check, prefix, what, f"{test} has {len(matrix.rows)} rows, not the one CPU row", rc)
        values = matrix.rows[0][1]
        if expected_gpus is not None and len(values) != expected_gpus:
            why = f"{test} measured {len(values)} GPU(s), the node has {expected_gpus}"
            return _unknown(check, prefix, what, why, rc, figures)
        if None in values:
            gpu = values.index(None)
            return _unknown(check, prefix, what, f"{test} measured nothing for GPU {gpu}", rc, figures)
        figures[f"{direction}_gbps"] = list(values)
        figures[f"{direction}_sum_gbps"] = matrix.total
        for gpu, value in enumerate(values):
            assert value is not None  # checked above
            if value < floor_gbps:
                where = f" ({report.devices[gpu]})" if gpu in report.devices else ""
                failures.append((value, f"GPU {gpu}{where} {direction} {value:.1f} GB/s"))
    if failures:
        below = f"below the {_gbps(floor_gbps)} GB/s floor of {floor_of}"
        named = [f"nvbandwidth {text} {below}" for _, text in sorted(failures)]  # the lowest first
        return CheckResult(check, FAIL, _reason(prefix, _more(named)), figures, tuple(named))
    lowest = min(min(figures["host_to_device_gbps"]), min(figures["device_to_host_gbps"]))
    why = f"{what} lowest {lowest:.1f} GB/s, floor {_gbps(floor_gbps)} GB/s of {floor_of}"
    return CheckResult(check, PASS, _reason(prefix, why), figures)
