"""Stopping a run: Ctrl-C, a cancel, or a timeout stop ansible-playbook and everything it started."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
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


class Stopper:
    """Whether the run must stop, polled by runner: the caller's cancel, Ctrl-C, the timeout, or an error in a
    callback (a display bug must stop the run cleanly, not leave ansible-playbook behind). The first yes stops
    ansible-playbook and everything it started."""

    def __init__(self, cancel: Callable[[], bool] | None, timeout: int | None) -> None:
        self.cancel, self.timeout = cancel, timeout
        self.cancelled, self.timed_out = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.started = time.monotonic()
        self.run_dir: Path | None = None
        self._stopped = False

    def __call__(self) -> bool:
        try:
            if self.cancel is not None and self.cancel():
                self.cancelled.set()
        except Exception as exc:
            self.errors.append(exc)
        if self.timeout and time.monotonic() - self.started > self.timeout:
            self.timed_out.set()
        stop = self.cancelled.is_set() or self.timed_out.is_set() or bool(self.errors)
        if stop and not self._stopped and self.run_dir is not None:
            self._stopped = True
            stop_ansible(self.run_dir)
        return stop
