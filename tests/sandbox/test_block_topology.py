"""Slurm's block topology on real daemons, on Debian 13 (Slurm 24.11): a multi-node job is placed inside one NVLink
block.

The cluster is tests/sandbox/blocks/cluster.yml, its own sandbox: a controller and four compute nodes, node[01-02]
in block nvl1 and node[03-04] in nvl2, each host on its os's base image (localhost/gpuinfra-debian13). With node01
held, the lowest-numbered free pair (node02, node03) would span both blocks; topology/block gives the two-node job
nvl2's pair instead. The cluster is removed at the end, so the stages after it have the machine back.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import MARKS, ROOT, on_host

from gpuinfra.cli.sandbox import IMAGE_ENV

pytestmark = MARKS

BLOCKS = Path(__file__).resolve().parent / "blocks" / "cluster.yml"


def _gpuinfra(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI without $GPUINFRA_NODE_IMAGE (the driver image the other sandbox tests share): each host
    runs its own os's base image."""
    env = {name: value for name, value in os.environ.items() if name != IMAGE_ENV}
    return subprocess.run(
        [sys.executable, "-m", "gpuinfra", *args], cwd=ROOT, capture_output=True, text=True, timeout=3600, env=env
    )


@pytest.fixture(scope="module")
def blocks() -> Iterator[Path]:
    for args in (("sandbox", "down"), ("sandbox", "up"), ("apply", "--yes")):
        done = _gpuinfra(*args, str(BLOCKS))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield BLOCKS
    _gpuinfra("sandbox", "down", str(BLOCKS))


def ok(script: str) -> str:
    done = on_host("ctl01", "sh", "-c", shlex.quote(script), cluster=BLOCKS)
    assert done.returncode == 0, (script, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout.strip()


def sbatch(*args: str) -> str:
    return ok(shlex.join(["sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args, "--wrap", "sleep 600"]))


def running(job: str) -> str:
    """The nodes of a job once it runs."""
    deadline = time.monotonic() + 120
    while (found := ok(f"squeue --noheader --jobs={job} --format=%T/%N")).split("/")[0] != "RUNNING":
        assert time.monotonic() < deadline, found
        time.sleep(2)
    return found.split("/", 1)[1]


def test_slurm_runs_the_block_plugin_with_both_blocks(blocks: Path) -> None:
    assert "topology/block" in ok("scontrol show config | grep -i '^TopologyPlugin'")
    assert ok("sinfo --noheader --format=%D/%t") == "4/idle"


def test_a_two_node_job_is_placed_inside_one_block(blocks: Path) -> None:
    held = sbatch("--nodelist=node01", "--cpus-per-task=2")
    assert running(held) == "node01"
    job = sbatch("--nodes=2")
    try:
        assert running(job) == "node[03-04]"
    finally:
        ok(f"scancel {held} {job}")
