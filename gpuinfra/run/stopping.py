"""Stopping a run: Ctrl-C, a cancel, or a timeout stop ansible-playbook and everything it started."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import psutil


@contextlib.contextmanager
def sigint_cancels(cancelled: threading.Event) -> Iterator[None]:
    """Ctrl-C during the run asks runner to stop ansible-playbook instead of unwinding past it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        cancelled.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# How long ansible-playbook has, once asked to stop, to stop its workers and their commands.
STOP_GRACE_SECONDS = 10


def stop_ansible(run_dir: Path) -> None:
    """Stop this run's ansible-playbook and everything it started. Runner's own stop kills the process group of
    ansible-playbook, but each of its workers leads a group of its own (ansible-core 2.19 and later), so a task's
    command (an apt run, a reboot, a drain) would go on after the run reported it stopped. SIGTERM lets
    ansible-playbook stop its workers; whatever of the run is still alive after the grace period is killed."""
    ours = [p for p in psutil.Process().children() if _belongs(p, run_dir)]
    started = [child for p in ours for child in _children(p)]
    for process in ours:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    # ansible-playbook itself is runner's to reap (pexpect waits for it); only what it started is waited for here.
    _, alive = psutil.wait_procs(started, timeout=STOP_GRACE_SECONDS)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _belongs(process: psutil.Process, run_dir: Path) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(str(run_dir) in argument for argument in process.cmdline())
    return False


def _children(process: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(process.children(recursive=True))
    return []
