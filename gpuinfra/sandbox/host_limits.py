"""The host limit that a sandbox runs out of first: inotify instances, which each container's systemd takes.

Past the limit (fs.inotify.max_user_instances, 128 on Debian), systemd in the next container never finishes
booting, and all `up` could say was a boot timeout two minutes later. So `up` counts first, and names the sysctl.
"""

from __future__ import annotations

import os
from pathlib import Path

LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
SYSCTL = "fs.inotify.max_user_instances"
PER_CONTAINER = 8
"""Instances a sandbox container takes: about 6 measured (199 in use with 33 containers booted), with a margin."""


def inotify_in_use(proc: Path = Path("/proc"), uid: int | None = None) -> int:
    """Inotify instances held by the processes of `uid` (this user): the count the limit applies to."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with os.scandir(os.path.join(entry.path, "fd")) as fds:
                count += sum(1 for fd in fds if os.readlink(fd.path) == "anon_inode:inotify")
        except OSError:  # a process that ended meanwhile, or one whose descriptors are not ours to read
            continue
    return count


def room_problem(new_containers: int, limit: int, in_use: int) -> str | None:
    """Why `new_containers` more containers would not boot, or None when they fit."""
    needed = new_containers * PER_CONTAINER
    if new_containers == 0 or in_use + needed <= limit:
        return None
    wanted = max(1024, 1 << (in_use + needed - 1).bit_length())
    return (
        f"{new_containers} new containers need about {needed} inotify instances, and {in_use} of this user's "
        f"{limit} ({SYSCTL}) are in use: systemd in a container would not finish booting. Raise the limit "
        f"(`sysctl -w {SYSCTL}={wanted}`, and a file in /etc/sysctl.d/ to keep it), or take other containers down"
    )


def check_room(new_containers: int) -> str | None:
    """room_problem() on this host; None where the limit cannot be read (not Linux)."""
    try:
        limit = int(LIMIT.read_text())
    except (OSError, ValueError):
        return None
    return room_problem(new_containers, limit, inotify_in_use())
