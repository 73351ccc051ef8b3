"""The skip rule, a plugin that tests/conftest.py installs. Under CI (`CI=true`) a skipped test fails the run: a test
that cannot run proves nothing, and a tool it needs is for the setup to install. Two tiers need what no CI machine
has, and a test there may skip for that one reason, which its skip reason states first:

- the GPU tier: a test under tests/gpu/, marked `gpu`, whose reason starts with GPU_ABSENT (nvidia-smi sees no GPU);
- the Kubernetes tier: a test under tests/k8s/ whose reason starts with K8S_ABSENT (no API server to ask, or not a
  Kubernetes node's runtime).

Any other skip fails the run: a `gpu` test elsewhere, a test of either tier skipping for another reason, a skip while
collecting (a module-level skip carries no marks, so it counts as unmarked), and reference material missing from
../shared/reference (REFERENCE_ABSENT): CI's checkout has it beside it, so its absence there is a broken CI.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Generator

import pytest

GPU_TIER = "tests/gpu/"
K8S_TIER = "tests/k8s/"
GPU_ABSENT = "no NVIDIA GPU here:"
K8S_ABSENT = "no Kubernetes cluster or node here:"
REFERENCE_ABSENT = "reference material absent:"
"""The start of a skip's reason when ../shared/reference is not beside the checkout: a failure under CI as any other."""


def strict() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def allowed(nodeid: str, reason: str, marks: Collection[str]) -> bool:
    """Whether a skip may pass under CI: only in a tier that needs what CI has not, and only for that reason."""
    if nodeid.startswith(GPU_TIER):
        return "gpu" in marks and reason.startswith(GPU_ABSENT)
    if nodeid.startswith(K8S_TIER):
        return reason.startswith(K8S_ABSENT)
    return False


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    """Records each skip the rule refuses, lists them at the end and fails the session."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def _judge(self, report: pytest.TestReport | pytest.CollectReport, marks: Collection[str]) -> None:
        reason = _reason(report)
        if not allowed(report.nodeid, reason, marks):
            self.refused.append(f"{report.nodeid}: {reason}")

    # The item's own marks, not the report's keywords: those also hold the names of its folders and functions, so a
    # test under tests/gpu/ would count as marked `gpu` without the mark.
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.skipped and not hasattr(report, "wasxfail"):
            self._judge(report, {mark.name for mark in item.iter_markers()})
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self._judge(report, ())

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.refused:
            terminalreporter.section("skipped under CI=true, which fails the run (tests/skip_policy.py)")
            for line in self.refused:
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # A run whose every test skipped while collecting would otherwise end "no tests collected", which
        # scripts/test accepts.
        if self.refused and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def install(config: pytest.Config) -> None:
    """Apply the rule to this session when it runs under CI."""
    if strict():
        config.pluginmanager.register(SkipPolicy(), "skip_policy")
