"""`gpuinfra sandbox up` refuses containers the host's inotify limit cannot boot, and names the sysctl."""

from __future__ import annotations

import os
from pathlib import Path

from gpuinfra.sandbox.host_limits import PER_CONTAINER, SYSCTL, inotify_in_use, room_problem


def _process(proc: Path, pid: int, links: list[str]) -> None:
    fd = proc / str(pid) / "fd"
    fd.mkdir(parents=True)
    for number, target in enumerate(links):
        (fd / str(number)).symlink_to(target)


def test_only_inotify_descriptors_of_this_user_count(tmp_path: Path) -> None:
    _process(tmp_path, 10, ["anon_inode:inotify", "/dev/null", "anon_inode:inotify"])
    _process(tmp_path, 11, ["anon_inode:[eventfd]", "anon_inode:inotify"])
    (tmp_path / "self").mkdir()  # not a process number
    assert inotify_in_use(tmp_path) == 3
    assert inotify_in_use(tmp_path, uid=os.getuid() + 1) == 0


def test_containers_that_fit_pass_and_those_that_do_not_name_the_sysctl() -> None:
    assert room_problem(3, 128, 100) is None  # 100 + 24 <= 128
    assert room_problem(0, 128, 500) is None  # nothing new to boot
    problem = room_problem(4, 128, 100)
    assert problem is not None
    assert f"about {4 * PER_CONTAINER} inotify instances" in problem and "100 of this user's 128" in problem
    assert f"sysctl -w {SYSCTL}=1024" in problem
    assert f"{SYSCTL}=2048" in str(room_problem(200, 128, 100))  # 1,700 needed: the next power of two
