"""The skip rule (tests/skip_policy.py), run by pytest itself: small test files laid out as this repository's tiers,
with tests/conftest.py as it is, run under CI=true and without it; the outcome is the session's exit code and what
the summary names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from skip_policy import GPU_ABSENT, K8S_ABSENT, REFERENCE_ABSENT

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
SECTION = "skipped under CI=true, which fails the run"
OTHER = "helm is not installed"


@pytest.fixture(autouse=True)
def no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only pytest's own plugins in the runs below: hypothesis's takes seconds to start, in each."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def layout(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    """This repository's tests/conftest.py and the given test files (path under tests/: body)."""
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a real NVIDIA GPU\n")  # the rootdir, as pyproject.toml is
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    for name, body in files.items():
        path = pytester.path / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import pytest\n\n" + textwrap.dedent(body))


def skipping(reason: str, gpu: bool = False) -> str:
    mark = "@pytest.mark.gpu\n" if gpu else ""
    return f"{mark}def test_it():\n    pytest.skip({reason!r})\n"


# (file under tests/, whether it is marked gpu, the skip's reason, whether CI lets it pass)
CASES = [
    ("gpu/test_gpu_absent.py", True, f"{GPU_ABSENT} nvidia-smi is not installed", True),
    ("gpu/test_gpu_other.py", True, OTHER, False),
    ("gpu/test_gpu_unmarked.py", False, f"{GPU_ABSENT} nvidia-smi is not installed", False),
    ("unit/test_gpu_elsewhere.py", True, f"{GPU_ABSENT} nvidia-smi is not installed", False),
    ("infra/test_gpu_infra.py", True, f"{GPU_ABSENT} nvidia-smi is not installed", False),
    ("k8s/test_k8s_absent.py", False, f"{K8S_ABSENT} no API server can run on this machine", True),
    ("k8s/test_k8s_other.py", False, OTHER, False),
    ("unit/test_k8s_elsewhere.py", False, f"{K8S_ABSENT} no API server can run on this machine", False),
    ("unit/test_reference.py", False, f"{REFERENCE_ABSENT} ../shared/reference/kueue is missing", False),
    ("unit/test_tool.py", False, OTHER, False),
]


@pytest.mark.parametrize(("name", "gpu", "reason", "passes"), CASES, ids=[case[0] for case in CASES])
def test_a_skip_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, gpu: bool, reason: str, passes: bool
) -> None:
    layout(pytester, {name: skipping(reason, gpu)})
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    if passes:
        assert result.ret == pytest.ExitCode.OK
        assert SECTION not in result.stdout.str()
    else:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines([f"*{SECTION}*", f"tests/{name}::test_it: {reason}"])


@pytest.mark.parametrize("ci", [None, "false"])
def test_every_skip_passes_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    layout(pytester, {name: skipping(reason, gpu) for name, gpu, reason, _ in CASES})
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=len(CASES))
    assert result.ret == pytest.ExitCode.OK
    assert SECTION not in result.stdout.str()


def test_a_skip_while_collecting_fails_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that skips itself collects no test: pytest alone would end "no tests collected", which scripts/test
    accepts. Even in the GPU tier, a module-level skip has no marks to show."""
    reason = f"{GPU_ABSENT} nvidia-smi is not installed"
    layout(
        pytester,
        {"gpu/test_module.py": f"pytestmark = pytest.mark.gpu\npytest.skip({reason!r}, allow_module_level=True)\n"},
    )
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*{SECTION}*", f"tests/gpu/test_module.py: {reason}"])


def test_xfail_and_a_real_failure_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """An expected failure is no skip; a run that already failed keeps its failure and still names the skip."""
    layout(
        pytester,
        {
            "unit/test_xfail.py": "@pytest.mark.xfail(reason='known', strict=True)\ndef test_it():\n    assert False\n",
            "unit/test_fails.py": "def test_it():\n    assert False\n",
            "unit/test_skips.py": skipping(OTHER),
        },
    )
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*{SECTION}*", f"tests/unit/test_skips.py::test_it: {OTHER}"])
    assert "test_xfail.py::test_it:" not in result.stdout.str()
