# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Read a GPU node: run nvidia-smi, read the kernel log, modinfo and `dkms status`, and judge them (verdict.py).

The one copy of that I/O, shared by the `gpu_health` module (through Ansible's run_command) and the
`gpuinfra-health` program (through subprocess). Callers hand in two functions, so this file needs neither:
`run(argv) -> (rc, stdout, stderr)` and `which(name) -> path or None`. Standard library only, Python 3.9 or newer.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .dkms import dkms_problems, installed_kernels, kernel_module_problems, parse_dkms_status
from .smi_report import SmiError, SmiReport, first_line, parse_smi_xml, smi_failure
from .verdict import Policy, assess

# Quoted: these aliases are evaluated at import, and hosts may run Python 3.9.
Run = Callable[[Sequence[str]], "tuple[int, str, str]"]
Which = Callable[[str], "str | None"]

SYS_MODULE_VERSION = "/sys/module/nvidia/version"
# What `modinfo` and `dkms status` read besides each kernel's modules folder: DKMS's tree and settings, and the
# module aliases (Debian's driver names its module nvidia-current and aliases it to nvidia).
MODULE_TREES = ("/var/lib/dkms", "/etc/dkms", "/etc/modprobe.d", "/lib/modprobe.d")
# The package managers' locks (dpkg's, apt's, rpm's): held while packages are installed, and so while DKMS builds
# the module for a kernel being installed.
PACKAGE_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/rpm/.rpm.lock")
# Seconds a held lock may defer the DKMS judgement: far longer than a kernel's DKMS build, far shorter than forever
# (an apt left at its prompt holds dpkg's lock for as long as nobody answers).
PACKAGE_LOCK_LIMIT = 30 * 60


@dataclass
class ProbeOptions:
    nvidia_smi: str = "nvidia-smi"
    timeout: int = 120
    """Seconds nvidia-smi may take before the GPU or driver counts as hung; 0: no limit."""
    check_kernel_module: bool = True
    check_dkms: bool = True
    dkms_module: str | None = None
    dkms_kernels: Sequence[str] = ()
    """Kernels DKMS must have built the module for; empty: the running kernel and every installed one."""
    fabric_manager_unit: str = "nvidia-fabricmanager"
    """Service that must be active where the policy says the GPUs sit on an NVSwitch fabric."""
    module_cache: dict[str, Any] | None = None
    """Where a caller that checks again and again keeps modinfo's and `dkms status`'s answers: they are asked again
    only when a file they read has changed (both unpack the 40 MB module, seconds of CPU on every check); None:
    always ask."""
    module_trees: Sequence[str] = MODULE_TREES
    modules_dir: str = "/lib/modules"
    dkms_verdict: dict[str, Any] | None = None
    """Where a caller that checks again and again keeps its last DKMS judgement. While another process holds a
    package manager's lock, a kernel being installed may not have its module yet (DKMS builds it inside the same
    dpkg run, for minutes), so the last judgement stands until the lock is free, or for package_lock_limit seconds
    (since `lock_since`, kept there too); None: always judged."""
    package_locks: Sequence[str] = PACKAGE_LOCKS
    package_lock_limit: float = PACKAGE_LOCK_LIMIT
    clock: Callable[[], float] = time.time
    """Wall-clock seconds: the deferral's start outlives the process that saw it, in the caller's state."""


@dataclass
class KernelLog:
    text: str | None
    """None when no log could be read; `source` then says why."""
    source: str
    cursor: str = ""
    """Where the next read continues (a journal cursor, or `offset:inode` of a file)."""


def read_smi(run: Run, which: Which, options: ProbeOptions) -> tuple[SmiReport | None, int | None, list[str]]:
    """Run `nvidia-smi -q -x` once. Returns the report (or None), its exit code, and node problems."""
    smi = options.nvidia_smi
    path = smi if os.path.sep in smi else which(smi)
    if not path or not os.access(path, os.X_OK):
        return None, None, [f"{smi} is not installed: no NVIDIA driver user-space tools on this node"]
    command = [path, "-q", "-x"]
    timeout = which("timeout")
    if timeout and options.timeout > 0:
        command = [timeout, "-k", "10", str(options.timeout), *command]
    rc, out, err = run(command)
    if out.lstrip().startswith("<"):
        try:
            report = parse_smi_xml(out)
        except SmiError as exc:
            return None, rc, [str(exc) if rc == 0 else smi_failure(rc, out, err)]
        problems = [] if rc == 0 else [f"nvidia-smi exited with code {rc}: {first_line(err) or 'no message'}"]
        return report, rc, problems
    return None, rc, [smi_failure(rc, out, err)]


def read_journal(run: Run, which: Which, after_cursor: str = "") -> KernelLog:
    """Kernel messages from the journal: since boot, or after a cursor a previous read returned."""
    journalctl = which("journalctl")
    if not journalctl:
        return KernelLog(None, "journalctl is not installed")
    command = [journalctl, "-k", "--no-pager", "-q", "-o", "short-iso", "--show-cursor"]
    command += [f"--after-cursor={after_cursor}"] if after_cursor else ["-b"]
    source = "journalctl -k " + ("after the last check" if after_cursor else "-b")
    rc, out, err = run(command)
    if rc != 0:
        return KernelLog(None, f"{source}: {first_line(err) or f'exit code {rc}'}")
    lines = out.splitlines()
    cursor = after_cursor
    if lines and lines[-1].startswith("-- cursor: "):
        cursor = lines.pop()[len("-- cursor: ") :].strip()
    return KernelLog("\n".join(lines), source, cursor)


def read_dmesg(run: Run, which: Which) -> KernelLog:
    dmesg = which("dmesg")
    if not dmesg:
        return KernelLog(None, "dmesg is not installed")
    rc, out, err = run([dmesg])
    if rc != 0:
        return KernelLog(None, f"dmesg: {first_line(err) or f'exit code {rc}'}")
    return KernelLog(out, "dmesg")


def read_log_file(path: str, cursor: str = "", limit: int = 4 << 20) -> KernelLog:
    """Kernel messages from a syslog file (kern.log): the part written after `cursor` (`offset:inode`), at most
    `limit` bytes of it. A rotated or truncated file is read from its start."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            offset = 0
            if cursor:
                old_offset, _, inode = cursor.partition(":")
                if inode == str(stat.st_ino) and old_offset.isdigit() and int(old_offset) <= stat.st_size:
                    offset = int(old_offset)
            offset = max(offset, stat.st_size - limit)
            handle.seek(offset)
            data = handle.read(limit)
    except OSError as exc:
        return KernelLog(None, f"{path}: {exc.strerror or exc}")
    source = f"{path} after the last check" if cursor else path
    return KernelLog(data.decode("utf-8", "replace"), source, f"{offset + len(data)}:{stat.st_ino}")


def module_versions(run: Run, which: Which) -> tuple[str | None, str | None]:
    """The nvidia module version modinfo finds for the running kernel, and the loaded one (None: none)."""
    modinfo_version = None
    modinfo = which("modinfo")
    if modinfo:
        rc, out, _ = run([modinfo, "-F", "version", "nvidia"])
        if rc == 0 and out.strip():
            modinfo_version = out.strip().splitlines()[0].strip()
    loaded_version = None
    try:
        with open(SYS_MODULE_VERSION, encoding="ascii", errors="replace") as handle:
            loaded_version = handle.read().strip() or None
    except OSError:
        pass
    return modinfo_version, loaded_version


def kernels_to_check(options: ProbeOptions) -> list[str]:
    running = os.uname().release
    return list(options.dkms_kernels) or installed_kernels(modules_dir=options.modules_dir, running=running)


def module_files_digest(kernels: Sequence[str], tools: Sequence[str | None], options: ProbeOptions) -> str:
    """A digest of the name, kind, size and modification time of every file modinfo and `dkms status` read (each
    kernel's modules folder, DKMS's tree, the aliases, the tools themselves): a package, a build or depmod that
    changes what they would answer changes it."""
    roots = [*options.module_trees, *(os.path.join(options.modules_dir, k) for k in kernels)]
    digest = hashlib.sha256("\0".join([*kernels, *(t or "" for t in tools)]).encode())
    for root in [*roots, *(t for t in tools if t)]:
        paths = [root]
        for folder, names, files in os.walk(root):
            names.sort()
            paths += [os.path.join(folder, name) for name in sorted(names + files)]
        for path in paths:
            try:
                info = os.lstat(path)
            except OSError:
                continue
            digest.update(f"{path}\0{info.st_mode}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}\n".encode())
    return digest.hexdigest()


def remembered(run: Run, cache: dict[str, Any] | None, digest: str) -> Run:
    """`run`, answering from `cache` a command that succeeded while the module files had this digest."""
    if cache is None:
        return run
    if cache.get("digest") != digest:
        cache.clear()
        cache.update(digest=digest, answers={})
    answers: dict[str, Any] = cache["answers"]

    def answer(argv: Sequence[str]) -> tuple[int, str, str]:
        key = "\0".join(argv)
        if key not in answers:
            rc, out, err = run(argv)
            if rc != 0:  # a failure or a timeout is asked again next time
                return rc, out, err
            answers[key] = [rc, out, err]
        rc, out, err = answers[key]
        return rc, out, err

    return answer


def lock_holder(paths: Sequence[str]) -> str | None:
    """'PID n holds PATH' for the first of these lock files another process holds as a package manager does: a
    write lock (fcntl's F_GETLK: only asks, so it never makes the package manager wait) on a file that only root,
    or the user this runs as, can open for writing. A read lock does not count: any user may take one on rpm's lock
    file, which is 0644. None when all are free or absent."""
    probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, probe))
        except OSError:
            continue
        finally:
            os.close(fd)
        writable_by_others = info.st_uid not in (0, os.geteuid()) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if kind == fcntl.F_WRLCK and stat.S_ISREG(info.st_mode) and not writable_by_others:
            return f"{f'PID {pid}' if pid > 0 else 'a process'} holds {path}"  # an open file description's lock: -1
    return None


Judged = tuple[list[str], list[Any], list[str], list[str]]
"""Kernels checked, nvidia DKMS entries, problems, and what could not be looked at (an unknown verdict's causes)."""


def dkms_state(run: Run, which: Which, pin: str, options: ProbeOptions) -> Judged:
    """The kernels checked, the nvidia DKMS entries, a problem for each kernel without the pinned module installed,
    and what could not be judged."""
    kept = options.dkms_verdict
    if kept is None:
        return _judge_dkms(run, which, pin, options)
    holder = lock_holder(options.package_locks)
    if not holder:
        kept.clear()  # the next hold starts its own clock
    else:
        now = options.clock()
        since = kept.get("lock_since")
        if not isinstance(since, (int, float)) or since > now:  # a clock set back restarts it: bounded still
            kept["lock_since"] = since = now
        held, limit = now - since, options.package_lock_limit
        if "problems" not in kept:
            kept["deferred"] = f"DKMS judged although the package manager runs ({holder}): no judgement to keep"
        elif held < limit:
            kept["deferred"] = (
                f"DKMS not judged while the package manager runs ({holder}): the last judgement stands"
                f" for up to {limit / 60:g} min"
            )
            return list(kept.get("kernels", [])), [], list(kept["problems"]), list(kept.get("unknown", []))
        else:
            # Judged again, but a module missing while a package run has held its lock this long may still be
            # building (or its dpkg hung): what the judgement finds wrong is unknown, not broken.
            kept["deferred"] = (
                f"DKMS judged: the package manager has held its lock for {held // 60:.0f} min ({holder}),"
                f" longer than the {limit / 60:g} min a deferral may last"
            )
            kernels, entries, problems, unknown = _judge_dkms(run, which, pin, options)
            held_text = f"(the package manager has held its lock for {held // 60:.0f} min: {holder})"
            return kernels, entries, [], [*unknown, *(f"{problem} {held_text}" for problem in problems)]
    kernels, entries, problems, unknown = _judge_dkms(run, which, pin, options)
    kept.update(kernels=kernels, problems=problems, unknown=unknown)
    return kernels, entries, problems, unknown


def _judge_dkms(run: Run, which: Which, pin: str, options: ProbeOptions) -> Judged:
    kernels = kernels_to_check(options)
    dkms = which("dkms")
    if not kernels:
        return kernels, [], ["DKMS: found no installed kernel to check (no /boot/vmlinuz-*, no modules folder)"], []
    if not dkms:
        return kernels, [], [], ["dkms is not installed: the kernels' nvidia modules cannot be checked"]
    rc, out, err = run([dkms, "status"])
    if rc != 0:
        return kernels, [], [], [f"dkms status failed (exit code {rc}): {first_line(err) or 'no message'}"]
    entries = parse_dkms_status(out)
    mine = [e for e in entries if e.module.startswith("nvidia")]
    return kernels, mine, dkms_problems(entries, pin, kernels, options.dkms_module), []


def service_state(run: Run, which: Which, unit: str) -> tuple[list[str], list[str]]:
    """Problems and unknowns of a unit that must run."""
    systemctl = which("systemctl")
    if not systemctl:
        return [], [f"systemctl is not installed, so {unit} cannot be checked"]
    rc, out, _ = run([systemctl, "is-active", unit])
    state = out.strip() or "unknown"
    return ([] if rc == 0 else [f"{unit} is {state}: NVSwitch systems need it to run jobs"]), []


def inspect(
    run: Run,
    which: Which,
    policy: Policy,
    options: ProbeOptions,
    xid_events: Sequence[Any],
    repeated: Sequence[Any] = (),
    unknown: Sequence[str] = (),
    problems: Sequence[str] = (),
) -> dict[str, Any]:
    """The node's verdict (verdict.assess) with what it was read from. `xid_events` come from the caller, which
    decides which part of the kernel log counts (since boot, or since its last check), and so do `repeated`, the
    GPUs the repetition rule makes faulty (verdict.repeated_faults over the caller's history), `unknown`, what
    the caller could not look at (its kernel log), and `problems`, what else it found wrong with the node (its
    last active checks)."""
    report, smi_rc, node_problems = read_smi(run, which, options)
    node_problems.extend(problems)
    pin = policy.driver_version
    if options.module_cache is not None and (options.check_kernel_module or options.check_dkms):
        read = sorted({*kernels_to_check(options), os.uname().release})  # modinfo reads the running one's
        tools = [which("modinfo"), which("dkms")]
        run = remembered(run, options.module_cache, module_files_digest(read, tools, options))
    modinfo_version, loaded_version = None, None
    unknown = list(unknown)
    if options.check_kernel_module and pin and not which("modinfo"):
        unknown.append("modinfo is not installed: the running kernel's nvidia module cannot be checked")
    elif options.check_kernel_module:
        modinfo_version, loaded_version = module_versions(run, which)
        node_problems.extend(kernel_module_problems(pin, modinfo_version, loaded_version))
    kernels: list[str] = []
    dkms_entries: list[Any] = []
    if options.check_dkms and pin:
        kernels, dkms_entries, problems, blind = dkms_state(run, which, pin, options)
        node_problems.extend(problems)
        unknown.extend(blind)
    if policy.fabric_manager:
        problems, blind = service_state(run, which, options.fabric_manager_unit)
        node_problems.extend(problems)
        unknown.extend(blind)
    verdict = assess(report, policy, xid_events, node_problems, repeated, unknown)
    return {
        **verdict,
        "nvidia_smi_rc": smi_rc,
        "dtd": report.dtd if report is not None else None,
        "xid_events": [e.__dict__ for e in xid_events],
        "kernel_module_version": modinfo_version,
        "loaded_module_version": loaded_version,
        "dkms_kernels": kernels,
        "dkms": [e.__dict__ for e in dkms_entries],
    }
