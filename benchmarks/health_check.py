"""The node health program's run time on a sandbox GPU node, against the nvidia-smi call it cannot avoid.

Runs `gpuinfra-health --no-action` (every check: nvidia-smi, the kernel log since the last check, dkms status) and
the bare `nvidia-smi -q -x` it starts from, each `--runs` times inside the node, and prints the median of each and
their ratio from this one run. On the sandbox nvidia-smi is the recorded responder, so the figure is the program's
own cost; on a real node add nvidia-smi's time (0.1 s to a few seconds, more with many GPUs).

    .venv/bin/python benchmarks/health_check.py [--host gpu01] [--runs 20]

Needs a converged sandbox (`gpuinfra sandbox up`, `gpuinfra apply`).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys

NVIDIA_SMI = "/usr/local/lib/gpuinfra-sandbox/nvidia-smi -q -x"
PROGRAM = "gpuinfra-health --no-action"


def timed(container: str, command: str, runs: int) -> list[float]:
    """Wall seconds of each run, measured inside the container (no SSH or podman start-up in the figure)."""
    script = f'for i in $(seq {runs}); do s=$(date +%s.%N); {command} >/dev/null; e=$(date +%s.%N); echo "$s $e"; done'
    done = subprocess.run(
        ["podman", "exec", container, "bash", "-c", script], capture_output=True, text=True, check=True
    )
    return [float(end) - float(start) for start, end in (line.split() for line in done.stdout.splitlines())]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="gpu01")
    parser.add_argument("--cluster", default="sandbox")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    container = f"{args.cluster}-{args.host}"
    check = subprocess.run(["podman", "exec", container, *shlex.split(PROGRAM)], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"{PROGRAM} on {args.host} did not pass: {check.stdout}{check.stderr}", file=sys.stderr)
        return 1
    smi = statistics.median(timed(container, NVIDIA_SMI, args.runs))
    program = statistics.median(timed(container, PROGRAM, args.runs))
    print(f"{args.host}, median of {args.runs} runs:")
    print(f"  nvidia-smi -q -x (recorded responder): {smi * 1000:7.1f} ms")
    print(f"  gpuinfra-health --no-action:          {program * 1000:7.1f} ms")
    print(f"  ratio:                                 {program / smi:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
