#!/usr/bin/python3
"""The sandbox's stand-in for nvidia-smi: answers `nvidia-smi -q -x` with the recorded output of the GPU state this
node is set to (`gpuinfra-sandbox-gpu STATE`, default healthy). Only the health program reads it; the checks
themselves are the real ones. Any other question is refused, so nothing mistakes it for a driver.

Like the real one, it answers with the version of the driver library installed on the node (the NVML library
nvidia-smi loads, libnvidia-ml.so.1 -> libnvidia-ml.so.VERSION), so an upgrade or a package moved off its pin is
seen by the version checks; with no driver library installed it fails as nvidia-smi does without a driver."""

import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
STATE = "/var/lib/gpuinfra-sandbox/gpu-state"
NVML = ("/usr/lib/*-linux-gnu/libnvidia-ml.so.1", "/usr/lib/*-linux-gnu/nvidia/current/libnvidia-ml.so.1")
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def installed_driver() -> str | None:
    """The version in the file name the NVML library's soname link points to, as the real nvidia-smi reports it."""
    for pattern in NVML:
        for link in sorted(glob.glob(pattern)):
            found = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.realpath(link))
            if found:
                return found.group(1)
    return None


try:
    with open(STATE, encoding="ascii") as handle:
        state = handle.read().strip() or "healthy"
except FileNotFoundError:
    state = "healthy"
if sys.argv[1:] != ["-q", "-x"]:
    sys.exit(f"sandbox nvidia-smi answers only -q -x, not {' '.join(sys.argv[1:]) or 'no arguments'}")
version = installed_driver()
if version is None:
    print(NO_DRIVER)
    sys.exit(9)
with open(os.path.join(HERE, f"{state}.xml"), encoding="utf-8") as handle:
    answer = handle.read()
sys.stdout.write(re.sub(r"<(driver_version|gsp_firmware_version)>[^<]*</", rf"<\1>{version}</", answer))
