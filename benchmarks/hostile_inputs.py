"""How long `gpuinfra validate` takes, and how much memory, on hostile and oversized cluster files, against the
same command on the sandbox's cluster file. Each file runs in its own process; prints wall time, peak RSS and the
ratio to the sandbox, from this one run. The target is every answer within 2 s and 256 MiB.

    .venv/bin/python benchmarks/hostile_inputs.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuinfra import limits

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "unit" / "bad"


def run(path: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS in MiB and exit code of one `gpuinfra validate` in a process of its own."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "gpuinfra", "validate", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not the largest of all children
    child.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss // 1024, child.returncode


def largest_file(folder: Path) -> Path:
    """A file just under the size limit: one node group per host, each host with its own address."""
    path = folder / "largest.yml"
    lines = ["name: lab", "node_groups:"]
    i = 0
    while sum(len(line) + 1 for line in lines) < limits.MAX_FILE_BYTES - 200:
        address = f"10.{i >> 16}.{(i >> 8) % 256}.{i % 256}"
        lines.append(f"  g{i}: {{hosts: h{i}, roles: [slurm_compute], addresses: {{h{i}: {address}}}}}")
        i += 1
    path.write_text("\n".join(lines) + "\n")
    return path


def yaml12_only(path: Path) -> Path:
    """The largest file ending in a flow mapping with a colon in a plain scalar: valid YAML 1.2 that libyaml
    refuses, so the loader parses it a second time with the pure-Python parser (the slowest path)."""
    text = path.read_text()
    lines = text.splitlines()
    while len(text) - len(lines[-1]) - 1 + 60 > limits.MAX_FILE_BYTES:
        lines.pop()
        text = "\n".join(lines) + "\n"
    out = path.with_name("yaml12.yml")
    out.write_text(text + "x-end: {max_time: 7-00:00:00}\n")
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        oversized = folder / "oversized.yml"
        oversized.write_text("name: lab\n# " + "x" * (20 * 1024 * 1024) + "\n")
        cases = [
            ("sandbox example (valid)", ROOT / "inventories" / "sandbox" / "cluster.yml"),
            ("20 MiB file", oversized),
            (f"largest file, {limits.MAX_FILE_BYTES // 1024} KiB", largest_file(folder)),
            ("largest, YAML 1.2 only at its end", yaml12_only(largest_file(folder))),
            *((name, BAD / name) for name in sorted(os.listdir(BAD)) if name.endswith(".yml")),
        ]
        base, _, _ = run(cases[0][1])
        print(f"{'input':<34} {'exit':>4} {'seconds':>8} {'ratio':>6} {'peak MiB':>9}")
        for name, path in cases:
            elapsed, peak, code = run(path)
            print(f"{name:<34} {code:>4} {elapsed:>8.2f} {elapsed / base:>5.2f}x {peak:>9}")


if __name__ == "__main__":
    main()
