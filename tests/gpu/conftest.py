"""Tests that need a real NVIDIA GPU: they skip, saying why, wherever `nvidia-smi -L` sees none.

They only read: they never change MIG mode, reset a GPU, or set clocks, power limits or persistence.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from skip_policy import GPU_ABSENT

ROOT = Path(__file__).resolve().parents[2]


def smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="session")
def gpu_listing() -> list[tuple[int, str, str]]:
    """(index, name, UUID) of every GPU `nvidia-smi -L` lists; skips the test where it lists none, with the one reason
    tests/skip_policy.py lets pass under CI."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip(f"{GPU_ABSENT} nvidia-smi is not installed")
    listing = smi("-L")
    gpus = [
        (int(m.group(1)), m.group(2), m.group(3))
        for m in re.finditer(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)", listing.stdout, re.MULTILINE)
    ]
    if listing.returncode != 0 or not gpus:
        reason = (listing.stdout + listing.stderr).strip().splitlines()
        pytest.skip(
            f"{GPU_ABSENT} nvidia-smi -L lists none ({reason[0] if reason else f'exit code {listing.returncode}'})"
        )
    return gpus


@pytest.fixture(scope="session")
def smi_xml(gpu_listing: list[tuple[int, str, str]]) -> str:
    """`nvidia-smi -q -x` of this machine, read once."""
    out = smi("-q", "-x")
    assert out.returncode == 0, f"nvidia-smi -q -x failed: {(out.stdout + out.stderr).strip()[:500]}"
    return out.stdout
