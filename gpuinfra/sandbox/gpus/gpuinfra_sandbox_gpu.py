#!/usr/bin/python3
"""Set the state this sandbox node's emulated GPUs answer with: healthy, xid79, row-remap-pending or gpu-missing.

A state with kernel messages (STATE.kern.log) also appends them, time-stamped, to the sandbox's kernel log, as the
driver would print them when the fault happens.

`--checks CHECK-fail` makes that active check's stand-in tool (gpu_checks.py) answer with its failing output on this
node, GPUs otherwise healthy; `--checks dcgm-slow` makes dcgmi take the two minutes a real level-2 diagnostic takes
before it passes; `--checks pass` makes them all pass again at once."""

import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
FOLDER = "/var/lib/gpuinfra-sandbox"
STATES = sorted(name[: -len(".xml")] for name in os.listdir(HERE) if name.endswith(".xml"))

CHECKS = ("pass", "dcgm-fail", "dcgm-slow", "nccl-fail", "nvbandwidth-fail")

if sys.argv[1:2] == ["--checks"]:
    if len(sys.argv) != 3 or sys.argv[2] not in CHECKS:
        sys.exit(f"usage: gpuinfra-sandbox-gpu --checks {{{','.join(CHECKS)}}}")
    os.makedirs(FOLDER, exist_ok=True)
    with open(os.path.join(FOLDER, "checks-state"), "w", encoding="ascii") as out:
        out.write(sys.argv[2] + "\n")
    print(f"active check stand-ins now answer as {sys.argv[2]}")
    sys.exit(0)
if len(sys.argv) != 2 or sys.argv[1] not in STATES:
    sys.exit(f"usage: gpuinfra-sandbox-gpu {{{','.join(STATES)}}}")
state = sys.argv[1]
os.makedirs(FOLDER, exist_ok=True)
messages = os.path.join(HERE, f"{state}.kern.log")
if os.path.exists(messages):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    host = os.uname().nodename
    with open(messages, encoding="utf-8") as source, open(os.path.join(FOLDER, "kern.log"), "a") as log:
        log.writelines(f"{stamp} {host} kernel: {line}" for line in source if line.strip())
with open(os.path.join(FOLDER, "gpu-state"), "w", encoding="ascii") as out:
    out.write(state + "\n")
print(f"emulated GPUs now answer as {state}")
