#!/usr/bin/python3
"""Set the state this sandbox node's emulated GPUs answer with: healthy, xid79, row-remap-pending or gpu-missing.

A state with kernel messages (STATE.kern.log) also appends them, time-stamped, to the sandbox's kernel log, as the
driver would print them when the fault happens."""

import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
FOLDER = "/var/lib/gpuinfra-sandbox"
STATES = sorted(name[: -len(".xml")] for name in os.listdir(HERE) if name.endswith(".xml"))

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
