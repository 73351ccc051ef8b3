"""Shared by every tier. Under CI (`CI=true`), a skipped test fails the run: a test that cannot run there proves
nothing, and a tool it needs is for the setup to install. Only the tiers that need what no CI machine has are
exempt: a real GPU (tests/gpu, the `gpu` mark), a Kubernetes cluster and its nodes' runtimes (tests/k8s), and the
reference material that is kept beside a checkout rather than in it (REFERENCE_ABSENT)."""

from __future__ import annotations

import os

import pytest

EXEMPT_TIERS = ("tests/gpu/", "tests/k8s/")
EXEMPT_MARKS = {"gpu"}
REFERENCE_ABSENT = "reference material absent:"
"""The start of a skip's reason when ../shared/reference is not beside the checkout (only there, never in it)."""

_skipped: list[str] = []


def _strict() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not (report.skipped and _strict()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report).removeprefix("Skipped: ")
    if (
        report.nodeid.startswith(EXEMPT_TIERS)
        or reason.startswith(REFERENCE_ABSENT)
        or EXEMPT_MARKS & set(report.keywords)
    ):
        return
    _skipped.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped:
        terminalreporter.section("skipped under CI=true, which fails the run")
        for line in _skipped:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
