#!/usr/bin/python3
"""The sandbox's stand-ins for the active GPU checks' tools: `dcgmi`, `all_reduce_perf` and `nvbandwidth`, each a
link to this program. Each answers the one command the admission gate runs (gpuinfra-active-checks) with a
synthetic output written in the tool's own format (checks/, see its README): the passing one, or the failing one
when `gpuinfra-sandbox-gpu --checks CHECK-fail` named that check on this node (`dcgm-slow`: the passing one after
the two minutes a real level-2 diagnostic takes). Any other question is refused, so
nothing mistakes them for the tools; the parsers and thresholds that judge their answers are the real ones."""

import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
STATE = "/var/lib/gpuinfra-sandbox/checks-state"
GPUS = "2"  # the sandbox's GPU nodes each have two emulated L4s, as the answers do

# tool -> (the arguments it answers, the answer's file name with {verdict} for pass or fail, its check's name)
ANSWERS = {
    "dcgmi": (["diag", "-r", "2", "-j"], "dcgm-diag-r2-{verdict}.json", "dcgm"),
    "all_reduce_perf": (["-b", "1M", "-e", "1G", "-f", "2", "-g", GPUS], "nccl-all-reduce-{verdict}.txt", "nccl"),
    "nvbandwidth": (
        ["-t", "host_to_device_memcpy_ce", "device_to_host_memcpy_ce"],
        "nvbandwidth-{verdict}.txt",
        "nvbandwidth",
    ),
}

tool = os.path.basename(sys.argv[0])
if tool not in ANSWERS:
    sys.exit(f"sandbox GPU check stand-in: run it as one of {', '.join(sorted(ANSWERS))}, not {tool}")
argv, answer, check = ANSWERS[tool]
if sys.argv[1:] != argv:
    sys.exit(f"sandbox {tool} answers only {' '.join(argv)}, not {' '.join(sys.argv[1:]) or 'no arguments'}")
try:
    with open(STATE, encoding="ascii") as handle:
        failing = handle.read().strip()
except FileNotFoundError:
    failing = "pass"
verdict = "fail" if failing == f"{check}-fail" else "pass"
if failing == f"{check}-slow":
    time.sleep(120)
with open(os.path.join(HERE, "checks", answer.format(verdict=verdict)), encoding="utf-8") as source:
    sys.stdout.write(source.read())
# Like the real tools: dcgmi exits non-zero when a test fails; nccl-tests and nvbandwidth exit 0 on a slow link.
sys.exit(1 if verdict == "fail" and tool == "dcgmi" else 0)
