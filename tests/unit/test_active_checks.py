"""plugins/module_utils/active_checks.py: the admission gate's active checks (DCGM diagnostics, nccl-tests'
all_reduce_perf, nvbandwidth) read and judged against the catalog's floors (gpuinfra/catalog.py).

No real output of these tools is at hand: ../shared/reference/gpu-checks holds NVIDIA's JSON schema of `dcgmi diag -j`
and a description of the text outputs, no recording. The passing cases are the sandbox's stand-ins
(gpuinfra/sandbox/gpus/checks, synthetic, in each tool's format as its source prints it); the failing ones are copies of
them with one thing changed each. Every DCGM document used as DCGM's own output is validated against the schema.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from file_module import module_util
from hypothesis import given, settings
from hypothesis import strategies as st
from skip_policy import REFERENCE_ABSENT

from gpuinfra import catalog

active = module_util("active_checks")

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "plugins" / "module_utils" / "active_checks.py"
STANDINS = ROOT / "gpuinfra" / "sandbox" / "gpus" / "checks"
SCHEMA = ROOT.parent / "shared" / "reference" / "gpu-checks" / "dcgm_diag_schema.json"
SCHEMA_SHA256 = "dc2b3606beb625db24ef5cf7f1d006b4adf22eeb76e32477f385df3330bd1377"  # NVIDIA/DCGM@686e1024, re-indented

L4_NCCL = catalog.nccl_all_reduce_floor("L4", 4)
L4_HOST = catalog.host_bandwidth_floor("L4", 4)


def standin(name: str) -> str:
    return (STANDINS / name).read_text(encoding="utf-8")


def dcgm_doc(name: str = "dcgm-diag-r2-pass.json") -> dict[str, Any]:
    document: dict[str, Any] = json.loads(standin(name))
    return document


def dcgm(document: Any, level: int | None = 2, rc: int | None = None) -> Any:
    return active.judge_dcgm_diag(json.dumps(document), level=level, rc=rc)


def nccl(text: str, floor: float = L4_NCCL.gbps, of: str = L4_NCCL.of, **kwargs: Any) -> Any:
    return active.judge_all_reduce(text, floor, of, **kwargs)


def nvbw(text: str, floor: float = L4_HOST.gbps, of: str = L4_HOST.of, **kwargs: Any) -> Any:
    return active.judge_host_bandwidth(text, floor, of, **kwargs)


def assert_one_line(result: Any) -> None:
    assert result.verdict in ("pass", "fail", "unknown")
    assert result.reason.startswith("gpuinfra admission: ")
    assert "\n" not in result.reason and "\r" not in result.reason
    assert len(result.reason) <= active.MAX_REASON
    assert result.reason.isprintable()


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    if not SCHEMA.is_file():
        pytest.skip(
            f"{REFERENCE_ABSENT} {SCHEMA} is missing: NVIDIA's dcgmi diag JSON schema is not beside the checkout"
        )
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())
    # "$schema": "http://json-schema.org/schema#" names no draft; the keywords it uses mean the same in all of them.
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


# --- DCGM documents: the stand-ins, and copies changed one way each ---------------------------------------------


def _test(document: dict[str, Any], name: str) -> dict[str, Any]:
    for category in document["DCGM Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            if test["name"] == name:
                found: dict[str, Any] = test
                return found
    raise KeyError(name)


LOW_BANDWIDTH = {  # DCGM_FR_LOW_BANDWIDTH (30), its message as dcgm_errors.h formats it
    "error_category": 13,
    "error_id": 30,
    "error_severity": 2,
    "warning": "Bandwidth of GPU 0 in direction h2d of 3.12 did not exceed minimum required bandwidth of 10.00.",
}


def _pcie_fails_on_gpu0() -> dict[str, Any]:
    document = dcgm_doc()
    pcie = _test(document, "pcie")
    pcie["results"][0].update(status="Fail", warnings=[LOW_BANDWIDTH])
    pcie["test_summary"] = {"status": "Fail", "warnings": [LOW_BANDWIDTH]}
    return document


def _summary_only_failure() -> dict[str, Any]:
    document = dcgm_doc()
    _test(document, "memory")["test_summary"] = {
        "status": "Fail",
        "warnings": [{"error_category": 16, "error_id": 44, "error_severity": 4, "warning": "There was an internal "
                      "error during the test: 'the memory test's results could not be collected'"}],
    }  # fmt: skip
    return document


def _two_failures() -> dict[str, Any]:
    document = dcgm_doc("dcgm-diag-r2-fail.json")
    pcie = _test(document, "pcie")
    pcie["results"][0].update(status="Fail", warnings=[LOW_BANDWIDTH])
    pcie["test_summary"] = {"status": "Fail", "warnings": [LOW_BANDWIDTH]}
    return document


def _warned() -> dict[str, Any]:
    document = dcgm_doc()
    software = _test(document, "software")
    warning = {"error_category": 3, "error_id": 29, "error_severity": 5, "warning": "Persistence mode for GPU 1 is "
               "disabled."}  # fmt: skip
    software["results"][1].update(status="Warn", warnings=[warning])
    software["test_summary"] = {"status": "Warn", "warnings": [warning]}
    return document


def _all_skipped() -> dict[str, Any]:
    document = dcgm_doc()
    for category in document["DCGM Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            test["test_summary"]["status"] = "Skip"
            for result in test["results"]:
                result["status"] = "Skip"
    return document


# What `dcgmi diag -j` prints when the diagnostic cannot run (Diag::HelperDisplayFailureMessage).
RUNTIME_ERROR = {
    "DCGM Diagnostic": {
        "runtime_error": "Error: Unable to complete diagnostic for group 2147483647. Return: (-37) : "
        "Diagnostic returned an error.\nNo GPUs were found.",
        "version": "4.2.3",
    }
}

# Every document the tests use as dcgmi's own output: each must be valid against NVIDIA's schema.
VALID_DCGM: dict[str, Callable[[], dict[str, Any]]] = {
    "pass": lambda: dcgm_doc(),
    "fail": lambda: dcgm_doc("dcgm-diag-r2-fail.json"),
    "pcie-fails-on-gpu0": _pcie_fails_on_gpu0,
    "summary-only-failure": _summary_only_failure,
    "two-failures": _two_failures,
    "warned": _warned,
    "all-skipped": _all_skipped,
    "runtime-error": lambda: copy.deepcopy(RUNTIME_ERROR),
}


@pytest.mark.parametrize("name", sorted(VALID_DCGM))
def test_every_dcgm_fixture_is_valid_against_nvidia_schema(name: str, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(schema).validate(VALID_DCGM[name]())


@pytest.mark.parametrize("path", sorted(STANDINS.glob("*.json")), ids=lambda p: p.name)
def test_every_dcgm_standin_is_valid_against_nvidia_schema(path: Path, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(schema).validate(json.loads(path.read_text()))


def test_dcgm_pass() -> None:
    result = dcgm(dcgm_doc())
    assert_one_line(result)
    assert (result.check, result.verdict, result.failures) == ("dcgm_diag", "pass", ())
    assert result.reason == "gpuinfra admission: dcgm diag -r 2 passed (software, memory, pcie)"
    assert result.figures["tests"] == {"software": "pass", "memory": "pass", "pcie": "pass"}
    assert result.figures["dcgm_version"] == "4.2.3"
    assert result.figures["serials"] == {"GPU 0": "1654023016421", "GPU 1": "1654023016458"}


def test_dcgm_failed_test_names_the_test_the_gpu_and_dcgm_message() -> None:
    result = dcgm(dcgm_doc("dcgm-diag-r2-fail.json"))
    assert_one_line(result)
    assert result.verdict == "fail"
    assert result.failures == ("memory on GPU 1: Found 3 faulty memory elements on GPU 1",)
    assert result.reason == (
        "gpuinfra admission: dcgm diag -r 2 failed memory on GPU 1: Found 3 faulty memory elements on GPU 1"
    )


def test_dcgm_failure_on_another_test_and_gpu() -> None:
    """The failing GPU's result carries the failure: the test's summary, which repeats it, is not named twice."""
    result = dcgm(_pcie_fails_on_gpu0())
    assert result.verdict == "fail"
    assert result.failures == (f"pcie on GPU 0: {LOW_BANDWIDTH['warning']}",)


def test_dcgm_failure_only_in_a_summary_is_named_by_its_test() -> None:
    result = dcgm(_summary_only_failure())
    assert result.verdict == "fail"
    assert result.failures == (
        "memory: There was an internal error during the test: 'the memory test's results could not be collected'",
    )


def test_dcgm_several_failures_are_all_listed_and_counted_in_the_reason() -> None:
    result = dcgm(_two_failures())
    assert_one_line(result)
    assert result.verdict == "fail"
    assert len(result.failures) == 2
    assert {f.split(":")[0] for f in result.failures} == {"memory on GPU 1", "pcie on GPU 0"}
    assert result.reason.endswith("(+1 more)")


def test_dcgm_warning_passes_and_is_reported() -> None:
    result = dcgm(_warned())
    assert result.verdict == "pass"
    assert result.figures["tests"]["software"] == "warn"
    assert "software on GPU 1: Persistence mode for GPU 1 is disabled." in result.figures["warnings"]


def test_dcgm_all_skipped_is_unknown() -> None:
    result = dcgm(_all_skipped())
    assert (result.verdict, result.reason) == (
        "unknown",
        "gpuinfra admission: dcgm diag -r 2 could not be judged: every test was skipped",
    )


def test_dcgm_runtime_error_is_unknown_with_dcgm_first_line() -> None:
    result = dcgm(RUNTIME_ERROR, rc=226)
    assert_one_line(result)
    assert result.verdict == "unknown"
    assert result.reason == (
        "gpuinfra admission: dcgm diag -r 2 could not be judged (exit status 226): DCGM could not run it: Error: "
        "Unable to complete diagnostic for group 2147483647. Return: (-37) : Diagnostic returned an error."
    )
    assert result.figures["dcgm_version"] == "4.2.3"


def test_dcgm_test_that_did_not_run_is_ignored() -> None:
    """DCGM writes a test it did not run with its name only (Diag::HelperJsonBuildOutput)."""
    document = dcgm_doc()
    document["DCGM Diagnostic"]["test_categories"][1]["tests"].append({"name": "memtest"})
    result = dcgm(document)
    assert result.verdict == "pass"
    assert "memtest" not in result.figures["tests"]


def _wrong_type(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    document = dcgm_doc()
    node: Any = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


RESULT0 = ("DCGM Diagnostic", "test_categories", 1, "tests", 0, "results", 0)
WRONG_TYPES = {
    "entity_id as a string": ((*RESULT0, "entity_id"), "0", "'entity_id' is not an integer"),
    "entity_id as a boolean": ((*RESULT0, "entity_id"), True, "'entity_id' is not an integer"),
    "status as a number": ((*RESULT0, "status"), 1, "'status' is not a string"),
    "results as an object": (RESULT0[:-1], {}, "'results' is not a list"),
    "tests as a string": (("DCGM Diagnostic", "test_categories", 0, "tests"), "software", "'tests' is not a list"),
    "categories as an object": (("DCGM Diagnostic", "test_categories"), {}, "'test_categories' is not a list"),
    "a result that is a number": (RESULT0, 7, "memory result 0 is not an object"),
    "a test that is a string": (("DCGM Diagnostic", "test_categories", 0, "tests", 0), "software", "is not an object"),
    "a category that is a list": (("DCGM Diagnostic", "test_categories", 2), [], "test category 2 is not an object"),
    "warning text as a list": (
        (*RESULT0, "warnings"),
        [{"error_category": 1, "error_id": 2, "error_severity": 3, "warning": ["x"]}],
        "'warning' is not a string",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_dcgm_field_of_the_wrong_type_is_unknown_and_the_schema_agrees(case: str, schema: dict[str, Any]) -> None:
    path, value, said = WRONG_TYPES[case]
    document = _wrong_type(path, value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(document)
    result = dcgm(document)
    assert_one_line(result)
    assert result.verdict == "unknown"
    assert said in result.reason


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("", "dcgmi printed nothing"),
        (standin("dcgm-diag-r2-fail.json")[:1500], "the output is not JSON"),  # cut off
        ("Error: unable to establish a connection to the host engine", "the output is not JSON"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "the output is not JSON"),
        ("[1, 2]", "the output is JSON but not an object"),
        ('{"metadata": {"version": "4.2.3"}}', "'DCGM Diagnostic' is not an object"),
        ('{"DCGM GPU Diagnostic": {"test_categories": []}}', "DCGM 3's JSON"),
        ("[" * 200_000, "nests deeper"),
        ("{" + " " * (active.MAX_OUTPUT_BYTES + 1) + "}", "more than the 4194304 a real run prints"),
    ],
    ids=["empty", "truncated", "text", "garbage", "array", "no-diagnostic", "dcgm3", "deep", "huge"],
)
def test_dcgm_unreadable_output_is_unknown(output: str | bytes, said: str) -> None:
    result = active.judge_dcgm_diag(output, level=1, rc=1)
    assert_one_line(result)
    assert result.verdict == "unknown"
    assert "(exit status 1)" in result.reason
    assert said in result.reason


def test_dcgm_unknown_status_is_unknown() -> None:
    result = dcgm(_wrong_type((*RESULT0, "status"), "Inconclusive"))
    assert result.verdict == "unknown"
    assert "memory on GPU 0: status 'inconclusive'" in result.reason


def test_dcgm_messages_reach_the_reason_as_one_bounded_printable_line() -> None:
    document = dcgm_doc("dcgm-diag-r2-fail.json")
    warning = _test(document, "memory")["results"][1]["warnings"][0]
    warning["warning"] = "Found 3 faulty\nmemory elements\x1b[31m on GPU 1\t" + "x" * 5000
    result = dcgm(document)
    assert_one_line(result)
    assert result.verdict == "fail"
    assert result.reason.startswith("gpuinfra admission: dcgm diag -r 2 failed memory on GPU 1: Found 3 faulty memory")
    assert result.failures[0].isprintable() and len(result.failures[0]) < 200


# --- nccl-tests all_reduce_perf -----------------------------------------------------------------------------------

NCCL_PASS = standin("nccl-all-reduce-pass.txt")
NCCL_ROW_1G = next(line for line in NCCL_PASS.splitlines() if line.split()[:1] == ["1073741824"])


def test_nccl_pass() -> None:
    result = nccl(NCCL_PASS, expected_ranks=2)
    assert_one_line(result)
    assert (result.check, result.verdict) == ("nccl_all_reduce", "pass")
    assert result.reason == "gpuinfra admission: nccl all_reduce busbw 11.8 GB/s, floor 7.8 GB/s of L4 at PCIe Gen4"
    assert result.figures["busbw_gbps"] == 11.80
    assert result.figures["size_bytes"] == 1 << 30
    assert result.figures["avg_busbw_gbps"] == 11.1228
    assert (result.figures["ranks"], result.figures["out_of_bounds"]) == (2, 0)


def test_nccl_low_bandwidth_fails_against_the_model_floor() -> None:
    floor = catalog.nccl_all_reduce_floor("H100-SXM5-80GB", 5)
    result = nccl(NCCL_PASS, floor.gbps, floor.of)
    assert_one_line(result)
    assert result.verdict == "fail"
    assert result.reason == (
        "gpuinfra admission: nccl all_reduce busbw 11.8 GB/s below the 270 GB/s floor of H100-SXM5-80GB"
    )
    assert result.failures == (result.reason.removeprefix("gpuinfra admission: "),)


def test_nccl_failing_standin_fails() -> None:
    result = nccl(standin("nccl-all-reduce-fail.txt"), expected_ranks=2)
    assert result.verdict == "fail"
    assert (
        result.reason
        == "gpuinfra admission: nccl all_reduce busbw 4.6 GB/s below the 7.8 GB/s floor of L4 at PCIe Gen4"
    )


def test_nccl_judges_the_largest_size_not_the_average() -> None:
    """The average (11.12) is under a floor of 11.5 that the largest size (11.80) clears."""
    assert nccl(NCCL_PASS, 11.5, "x").verdict == "pass"
    assert nccl(NCCL_PASS, 11.81, "x").verdict == "fail"


def test_nccl_out_of_bounds_values_fail_whatever_the_bandwidth() -> None:
    corrupted = NCCL_PASS.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 2 FAILED")
    corrupted = corrupted.replace(NCCL_ROW_1G, NCCL_ROW_1G[: NCCL_ROW_1G.rindex("0")] + "4096")
    result = nccl(corrupted, 1.0, "x")
    assert_one_line(result)
    assert result.verdict == "fail"
    assert result.reason == (
        "gpuinfra admission: nccl all_reduce returned corrupted data (2 out-of-bounds results, 4096 wrong elements)"
    )


def test_nccl_wrong_elements_fail_even_when_the_summary_says_ok() -> None:
    corrupted = NCCL_PASS.replace(NCCL_ROW_1G, NCCL_ROW_1G[: NCCL_ROW_1G.rindex("0")] + "1e+06")
    result = nccl(corrupted, 1.0, "x")
    assert result.verdict == "fail"
    assert "1000000 wrong elements" in result.reason


def test_nccl_failed_word_alone_fails() -> None:
    result = nccl(NCCL_PASS.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 0 FAILED"), 1.0, "x")
    assert result.verdict == "fail"


def _cut(text: str, before: str) -> str:
    return text[: text.index(before)]


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (_cut(NCCL_PASS, "# Out of bounds"), "the output ends before its '# Out of bounds values' line"),
        (_cut(NCCL_PASS, "# Avg bus"), "the output ends before its '# Avg bus bandwidth' line"),
        (NCCL_PASS.replace("# Out of bounds values : 0 OK\n", ""), "ends before its '# Out of bounds values' line"),
        (_cut(NCCL_PASS, NCCL_ROW_1G) + NCCL_ROW_1G[:60], "fields, the header 13: a cut-off row"),
        (_cut(NCCL_PASS, "     1048576"), "the result table has no row"),
        ("", "no result table"),
        ("\x00\xff garbage\n1 2 3\n", "no result table"),
        (
            _cut(NCCL_PASS, "     1048576") + "gpu01: Test NCCL failure common.cu:1005 'unhandled cuda error'\n",
            "gpu01: Test NCCL failure common.cu:1005 'unhandled cuda error'",
        ),
        (NCCL_PASS.replace(" 11.80 ", "   nan ", 1), "is not a result row"),
        (NCCL_PASS.replace("# Avg bus bandwidth    : 11.1228", "# Avg bus bandwidth    : inf"), "is not a number"),
        (  # other scripts' digits are no size: the row is not read
            NCCL_PASS.replace(NCCL_ROW_1G, NCCL_ROW_1G.replace("1073741824", "١٠٧٣٧٤١٨٢٤")),
            "its largest message is 536870912 bytes",
        ),
        (NCCL_PASS + "#" * (active.MAX_OUTPUT_BYTES + 1), "more than the 4194304 a real run prints"),
    ],
    ids=[
        "no-oob",
        "no-avg",
        "only-no-oob",
        "cut-row",
        "no-rows",
        "empty",
        "garbage",
        "nccl-failure",
        "nan",
        "inf",
        "digits",
        "huge",
    ],
)
def test_nccl_unreadable_output_is_unknown(output: str, said: str) -> None:
    result = nccl(output, rc=1)
    assert_one_line(result)
    assert result.verdict == "unknown"
    assert result.reason.startswith("gpuinfra admission: nccl all_reduce could not be judged (exit status 1): ")
    assert said in result.reason


def _rows(text: str, change: Any) -> str:
    """`text` with each table row's fields changed by `change` (fields -> fields), joined as nccl-tests spaces them."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        out.append(line if line.startswith("#") or not fields else "  ".join(change(fields)))
    return "\n".join(out) + "\n"


def test_nccl_without_data_check_is_unknown() -> None:
    unchecked = _rows(NCCL_PASS, lambda f: [*f[:8], "N/A", *f[9:12], "N/A"])
    result = nccl(unchecked)
    assert result.verdict == "unknown"
    assert "without checking its data (-c 0)" in result.reason


def test_nccl_single_rank_is_unknown() -> None:
    one = "\n".join(line for line in NCCL_PASS.splitlines() if not line.startswith("#  Rank  1"))
    result = nccl(one)
    assert result.verdict == "unknown"
    assert result.reason.endswith("one rank: a single GPU has no all-reduce bandwidth")


def test_nccl_other_rank_count_than_the_node_is_unknown() -> None:
    result = nccl(NCCL_PASS, expected_ranks=8)
    assert result.verdict == "unknown"
    assert result.reason.endswith("it ran on 2 rank(s), the node has 8 GPU(s)")


def test_nccl_largest_message_under_the_floor_size_is_unknown() -> None:
    small = "\n".join(
        line for line in NCCL_PASS.splitlines() if not re.match(r"\s+(1073741824|536870912|268435456) ", line)
    )
    result = nccl(small)
    assert result.verdict == "unknown"
    assert result.reason.endswith("its largest message is 134217728 bytes, under the 1073741824 its floor is set for")
    assert nccl(small, min_bytes=1 << 27).verdict == "pass"


def test_nccl_older_table_without_root_column_parses() -> None:
    older = _rows(NCCL_PASS.replace("    root", ""), lambda f: [*f[:4], *f[5:]])
    assert " -1 " not in older
    result = nccl(older)
    assert (result.verdict, result.figures["busbw_gbps"]) == ("pass", 11.80)


def test_nccl_info_lines_between_rows_are_not_rows() -> None:
    noisy = NCCL_PASS.replace(NCCL_ROW_1G, "gpu01:4242:4250 [1] NCCL INFO Channel 00 : 1[2a000] -> 0[18000] via SHM\n"
                              + NCCL_ROW_1G)  # fmt: skip
    assert nccl(noisy).verdict == "pass"


def test_nccl_standin_rows_are_self_consistent() -> None:
    """busbw = algbw x 2(n-1)/n (nccl-tests' doc/PERFORMANCE.md) and time = size / algbw, in both halves of a row."""
    ranks = len(re.findall(r"(?m)^#\s+Rank\s+\d+", NCCL_PASS))
    for name in ("nccl-all-reduce-pass.txt", "nccl-all-reduce-fail.txt"):
        for line in standin(name).splitlines():
            if line.startswith("#") or not line.strip():
                continue
            fields = line.split()
            size = int(fields[0])
            for time_us, algbw, busbw in ((fields[5], fields[6], fields[7]), (fields[9], fields[10], fields[11])):
                assert float(busbw) == pytest.approx(float(algbw) * 2 * (ranks - 1) / ranks, abs=0.01)
                assert size / float(time_us) / 1e3 == pytest.approx(float(algbw), rel=0.01)


# --- nvbandwidth --------------------------------------------------------------------------------------------------

NVBW_PASS = standin("nvbandwidth-pass.txt")


def test_nvbandwidth_pass() -> None:
    result = nvbw(NVBW_PASS, expected_gpus=2)
    assert_one_line(result)
    assert (result.check, result.verdict) == ("nvbandwidth", "pass")
    assert result.reason == (
        "gpuinfra admission: nvbandwidth host<->device lowest 24.6 GB/s, floor 18.9 GB/s of L4 at PCIe Gen4"
    )
    assert result.figures["host_to_device_gbps"] == [24.61, 24.58]
    assert result.figures["device_to_host_gbps"] == [26.13, 26.09]
    assert result.figures["host_to_device_sum_gbps"] == 49.19
    assert result.figures["devices"] == {"0": "00000000:18:00", "1": "00000000:2a:00"}
    assert result.figures["nvbandwidth_version"] == "v0.8"


def test_nvbandwidth_low_gpu_is_named() -> None:
    result = nvbw(standin("nvbandwidth-fail.txt"), expected_gpus=2)
    assert_one_line(result)
    assert result.verdict == "fail"
    assert result.failures == (
        "nvbandwidth GPU 1 (00000000:2a:00) host_to_device 6.1 GB/s below the 18.9 GB/s floor of L4 at PCIe Gen4",
        "nvbandwidth GPU 1 (00000000:2a:00) device_to_host 6.5 GB/s below the 18.9 GB/s floor of L4 at PCIe Gen4",
    )
    assert result.reason == f"gpuinfra admission: {result.failures[0]} (+1 more)"


def test_nvbandwidth_one_direction_low_on_one_gpu() -> None:
    low = NVBW_PASS.replace("26.13     26.09", "26.13     12.00").replace(
        "SUM device_to_host_memcpy_ce 52.22", "SUM device_to_host_memcpy_ce 38.13"
    )
    result = nvbw(low)
    assert result.verdict == "fail"
    assert result.failures == (
        "nvbandwidth GPU 1 (00000000:2a:00) device_to_host 12.0 GB/s below the 18.9 GB/s floor of L4 at PCIe Gen4",
    )


def test_nvbandwidth_floor_at_a_lower_pcie_generation() -> None:
    """An L4 in a Gen3 slot is judged against the Gen3 floor: the failing GPU's 6.1 GB/s is still under it."""
    floor = catalog.host_bandwidth_floor("L4", 3)
    assert nvbw(NVBW_PASS, floor.gbps, floor.of).verdict == "pass"
    result = nvbw(standin("nvbandwidth-fail.txt"), floor.gbps, floor.of)
    assert result.verdict == "fail"
    assert result.reason.endswith("below the 9.4 GB/s floor of L4 at PCIe Gen3 (+1 more)")


H2D_BLOCK = NVBW_PASS[NVBW_PASS.index("Running host_to_device") : NVBW_PASS.index("Running device_to_host")]


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (NVBW_PASS.replace(H2D_BLOCK, "Waived: \n"), "no host_to_device_memcpy_ce result (waived, or not run)"),
        (
            NVBW_PASS.replace(H2D_BLOCK, "Running host_to_device_memcpy_ce.\nError: cuMemHostAlloc failed\n\n"),
            "no host_to_device_memcpy_ce result (Error: cuMemHostAlloc failed)",
        ),
        (_cut(NVBW_PASS, "SUM device_to_host"), "device_to_host_memcpy_ce: the output ends before its 'SUM"),
        (_cut(NVBW_PASS, " 0     26.13"), "device_to_host_memcpy_ce: the matrix has no row"),
        (_cut(NVBW_PASS, "           0         1\n 0     26.13"), "ends after the matrix title"),
        (NVBW_PASS.replace("24.61     24.58", "24.61     29.58"), "SUM '49.19' is not the sum of its matrix (54.19)"),
        (NVBW_PASS.replace("24.61     24.58", "24.61"), "does not fit 2 column(s)"),
        (NVBW_PASS.replace("24.61     24.58", "24.61       nan"), "does not fit 2 column(s)"),
        (
            NVBW_PASS.replace("24.61     24.58", "24.61       N/A").replace("ce 49.19", "ce 24.61"),
            "host_to_device_memcpy_ce measured nothing for GPU 1",
        ),
        ("", "no host_to_device_memcpy_ce result"),
        ("\x00\x01\x02 binary junk \xff", "no host_to_device_memcpy_ce result"),
        (NVBW_PASS + "x" * (active.MAX_OUTPUT_BYTES + 1), "more than the 4194304 a real run prints"),
    ],
    ids=[
        "waived",
        "error",
        "no-sum",
        "no-rows",
        "title-only",
        "bad-sum",
        "short-row",
        "nan",
        "n/a",
        "empty",
        "garbage",
        "huge",
    ],
)
def test_nvbandwidth_unreadable_output_is_unknown(output: str, said: str) -> None:
    result = nvbw(output)
    assert_one_line(result)
    assert result.verdict == "unknown"
    assert said in result.reason


def test_nvbandwidth_other_gpu_count_than_the_node_is_unknown() -> None:
    result = nvbw(NVBW_PASS, expected_gpus=4)
    assert result.verdict == "unknown"
    assert result.reason.endswith("host_to_device_memcpy_ce measured 2 GPU(s), the node has 4")


def test_nvbandwidth_other_tests_are_read_but_not_judged() -> None:
    """An NVLink matrix (N/A on its diagonal), a bidirectional test's three matrices and another test's error, before
    the host tests, are read and do not change the verdict."""
    d2d = (
        "Running device_to_device_memcpy_read_ce.\nmemcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)\n"
        "           0         1\n 0       N/A     22.10\n 1     22.30       N/A\n\n"
        "SUM device_to_device_memcpy_read_ce 44.40\n\n"
    )
    bidirectional = "Running device_to_device_bidirectional_memcpy_read_ce.\n" + "".join(
        f"memcpy CE CPU(row) <-> GPU(column) {part} bandwidth (GB/s)\n           0         1\n"
        f" 0       N/A     {value:.2f}\n 1     {value:.2f}       N/A\n\n"
        f"SUM device_to_device_bidirectional_memcpy_read_ce_{part.lower()} {2 * value:.2f}\n\n"
        for part, value in (("Read1", 20.5), ("Read2", 20.25), ("Total", 40.75))
    )
    failed = "Running all_to_host_memcpy_ce.\nError: cuMemAlloc failed\n\n"
    text = NVBW_PASS.replace("Running host_to_device", d2d + bidirectional + failed + "Running host_to_device", 1)
    report = active.parse_nvbandwidth(text)
    assert report.matrices["device_to_device_memcpy_read_ce"].total == 44.40
    assert [key for key in report.matrices if "bidirectional" in key] == [
        f"device_to_device_bidirectional_memcpy_read_ce_{part}" for part in ("read1", "read2", "total")
    ]
    assert report.errors == {"all_to_host_memcpy_ce": "Error: cuMemAlloc failed"}
    assert nvbw(text).verdict == "pass"


# --- every stand-in: synthetic, parseable, with the verdict its name says ----------------------------------------

JUDGE = {
    "dcgm-diag": lambda text: active.judge_dcgm_diag(text, level=2),
    "nccl-all-reduce": lambda text: nccl(text, expected_ranks=2),
    "nvbandwidth": lambda text: nvbw(text, expected_gpus=2),
}


@pytest.mark.parametrize("path", sorted(STANDINS.glob("*-*.*")), ids=lambda p: p.name)
def test_every_standin_says_it_is_synthetic_parses_and_has_its_verdict(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    tool, verdict = re.fullmatch(r"(.+?)(?:-r\d)?-(pass|fail)\.(?:json|txt)", path.name).groups()  # type: ignore[union-attr]
    if path.suffix == ".json":
        assert json.loads(text)["gpuinfra_stand_in"].startswith("synthetic:")
    else:
        assert "gpuinfra sandbox stand-in: synthetic:" in text.splitlines()[0]
    result = JUDGE[tool](text)
    assert_one_line(result)
    assert result.verdict == verdict


def test_the_standins_cover_each_tool_passing_and_failing() -> None:
    names = {path.name for path in STANDINS.iterdir() if path.name != "README.md"}
    tools = {"dcgm-diag-r2": "json", "nccl-all-reduce": "txt", "nvbandwidth": "txt"}
    assert names == {f"{tool}-{verdict}.{ext}" for tool, ext in tools.items() for verdict in ("pass", "fail")}


# --- any input gives a verdict, never a traceback ----------------------------------------------------------------

JUDGES = [
    lambda data: active.judge_dcgm_diag(data),
    lambda data: active.judge_all_reduce(data, 10.0, "x"),
    lambda data: active.judge_host_bandwidth(data, 10.0, "x"),
]


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=600), st.text(max_size=600)), which=st.integers(0, 2))
def test_any_input_gives_a_verdict(data: str | bytes, which: int) -> None:
    assert_one_line(JUDGES[which](data))


_LINES = st.lists(st.sampled_from(NCCL_PASS.splitlines() + NVBW_PASS.splitlines() + ["", "#", "0 N/A"]), max_size=60)


@settings(max_examples=200, deadline=None)
@given(lines=_LINES, which=st.integers(1, 2))
def test_shuffled_real_lines_give_a_verdict(lines: list[str], which: int) -> None:
    assert_one_line(JUDGES[which]("\n".join(lines)))


@settings(max_examples=100, deadline=None)
@given(json_value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["DCGM Diagnostic", "test_categories", "tests", "results", "test_summary", "status", "name",
                         "category", "entity_group", "entity_id", "warnings", "warning", "runtime_error"]),
        children, max_size=5),
    max_leaves=30))  # fmt: skip
def test_any_json_gives_a_verdict(json_value: Any) -> None:
    assert_one_line(active.judge_dcgm_diag(json.dumps(json_value)))


# --- the floors per GPU model (gpuinfra/catalog.py) ------------------------------------------------------------


def test_every_catalog_model_has_bandwidth_floors() -> None:
    for spec in catalog.specs():
        link = catalog.interconnect(spec.name)
        assert link is not None, spec.name
        for gen in (1, 2, 3, 4, 5):
            nccl_floor = catalog.nccl_all_reduce_floor(spec.name, gen)
            host_floor = catalog.host_bandwidth_floor(spec.name, gen)
            # A floor is well under the link it is a floor of, and above nothing.
            if spec.nvswitch_board and link.nvlink_gbps:
                assert 0 < nccl_floor.gbps <= link.nvlink_gbps / 2 * 0.6
            else:
                assert 0 < nccl_floor.gbps <= catalog.pcie_x16_gbps(min(gen, link.pcie_gen)) * 0.25
            peak = link.c2c_gbps / 2 if link.c2c_gbps else catalog.pcie_x16_gbps(min(gen, link.pcie_gen))
            assert 0 < host_floor.gbps <= peak * 0.6
            assert nccl_floor.basis and host_floor.basis


@pytest.mark.parametrize(
    ("model", "gen", "nccl_floor", "host_floor"),
    [
        ("H100-SXM5-80GB", 5, (270.0, "H100-SXM5-80GB"), (37.8, "H100-SXM5-80GB at PCIe Gen5")),
        ("H200-SXM5-141GB", 5, (270.0, "H200-SXM5-141GB"), (37.8, "H200-SXM5-141GB at PCIe Gen5")),
        ("A100-SXM4-80GB", 4, (180.0, "A100-SXM4-80GB"), (18.9, "A100-SXM4-80GB at PCIe Gen4")),
        ("A800-SXM4-80GB", 4, (120.0, "A800-SXM4-80GB"), (18.9, "A800-SXM4-80GB at PCIe Gen4")),
        ("V100-SXM2-32GB", 3, (90.0, "V100-SXM2-32GB"), (9.4, "V100-SXM2-32GB at PCIe Gen3")),
        ("B200", 5, (540.0, "B200"), (37.8, "B200 at PCIe Gen5")),
        ("L4", 4, (7.8, "L4 at PCIe Gen4"), (18.9, "L4 at PCIe Gen4")),
        ("L4", 5, (7.8, "L4 at PCIe Gen4"), (18.9, "L4 at PCIe Gen4")),  # a Gen4 GPU in a Gen5 slot
        ("L4", 3, (3.9, "L4 at PCIe Gen3"), (9.4, "L4 at PCIe Gen3")),  # in a Gen3 slot
        ("H100-PCIE-80GB", 5, (15.7, "H100-PCIE-80GB at PCIe Gen5"), (37.8, "H100-PCIE-80GB at PCIe Gen5")),
        ("T4", 3, (3.9, "T4 at PCIe Gen3"), (9.4, "T4 at PCIe Gen3")),
        ("GH200-144GB", 5, (270.0, "GH200-144GB"), (270.0, "GH200-144GB over NVLink-C2C")),
        ("h100-sxm5-80gb", 5, (270.0, "H100-SXM5-80GB"), (37.8, "H100-SXM5-80GB at PCIe Gen5")),
    ],
)
def test_floors_per_model(model: str, gen: int, nccl_floor: tuple[float, str], host_floor: tuple[float, str]) -> None:
    nccl_got = catalog.nccl_all_reduce_floor(model, gen)
    host_got = catalog.host_bandwidth_floor(model, gen)
    assert (nccl_got.gbps, nccl_got.of) == nccl_floor
    assert (host_got.gbps, host_got.of) == host_floor


def test_pcie_bandwidth_per_generation() -> None:
    assert [round(catalog.pcie_x16_gbps(gen), 2) for gen in (1, 2, 3, 4, 5)] == [4.0, 8.0, 15.75, 31.51, 63.02]


def test_floors_refuse_unknown_models_and_generations() -> None:
    with pytest.raises(ValueError, match="no bandwidth floors for GPU model 'Z100'"):
        catalog.nccl_all_reduce_floor("Z100", 4)
    with pytest.raises(ValueError, match="PCIe generation 7 is not one of"):
        catalog.host_bandwidth_floor("L4", 7)
    assert catalog.interconnect("Z100") is None


# --- host-side code: standard library, Python 3.9 -------------------------------------------------------------


def test_the_module_is_stdlib_only_and_python39_syntax() -> None:
    source = MODULE.read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 or node.module is None or node.module.split(".")[0] in {"module_utils"}
            if node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
    # What Python 3.9 lacks at run time: zip(strict=), str.removeprefix is 3.9 (fine), match, | between types.
    assert "strict=" not in source
    assert not re.search(r"isinstance\([^)]*\|", source)
