#!/usr/bin/python3
"""Write the Slurm state of every node as Prometheus metrics for the node exporter's textfile collector.

No Slurm exporter is packaged for Debian 12, so the node exporter on the Slurm controller publishes what sinfo
says. The file is replaced atomically, so the collector never reads half of it. When sinfo fails, the file says
so (gpuinfra_slurm_sinfo_success 0) instead of keeping stale states.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

# One line per node and partition: name, extended state (e.g. "down*", "drained", "mixed+drain"), reason.
SINFO_FORMAT = "%N|%T|%E"
DRAINED = {"drain", "drained", "draining"}
DOWN = {"down", "fail", "failing"}
# Suffixes sinfo appends to a state: * not responding, ~ powered off, # powering up, ! pending power down,
# % powering down, $ maintenance reservation, @ pending reboot, ^ reboot issued, - planned.
SUFFIXES = "*~#!%$@^-"


def parse(text: str) -> dict[str, dict[str, object]]:
    """sinfo lines -> {node: {state, drained, down, reason}}; a node listed in several partitions appears once."""
    nodes: dict[str, dict[str, object]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, rest = line.partition("|")
        raw_state, _, reason = rest.partition("|")
        raw_state = raw_state.strip().lower()
        words = raw_state.rstrip(SUFFIXES).split("+")
        base, flags = words[0], set(words[1:])
        responding = "*" not in raw_state
        nodes[name.strip()] = {
            "state": base or "unknown",
            "drained": base in DRAINED or bool(flags & DRAINED),
            "down": base in DOWN or not responding,
            "reason": "" if reason.strip() in ("", "none") else reason.strip(),
        }
    return nodes


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(nodes: dict[str, dict[str, object]] | None) -> str:
    """The textfile for these nodes; None means sinfo failed."""
    out = [
        "# HELP gpuinfra_slurm_sinfo_success 1 when sinfo answered, 0 when it failed.",
        "# TYPE gpuinfra_slurm_sinfo_success gauge",
        f"gpuinfra_slurm_sinfo_success {0 if nodes is None else 1}",
    ]
    if nodes is None:
        return "\n".join(out) + "\n"
    out += [
        "# HELP gpuinfra_slurm_node_state Slurm base state of the node: the series with value 1 names it.",
        "# TYPE gpuinfra_slurm_node_state gauge",
    ]
    out += [
        f'gpuinfra_slurm_node_state{{node="{_label(n)}",state="{_label(str(v["state"]))}"}} 1'
        for n, v in sorted(nodes.items())
    ]
    for metric, help_text in (
        ("drained", "1 when the node is drained or draining: no new job starts on it."),
        ("down", "1 when the node is down, failed or not responding."),
    ):
        out += [f"# HELP gpuinfra_slurm_node_{metric} {help_text}", f"# TYPE gpuinfra_slurm_node_{metric} gauge"]
        for name, values in sorted(nodes.items()):
            flagged = bool(values[metric])
            reason = f',reason="{_label(str(values["reason"]))}"' if flagged and values["reason"] else ""
            out.append(f'gpuinfra_slurm_node_{metric}{{node="{_label(name)}"{reason}}} {int(flagged)}')
    return "\n".join(out) + "\n"


def write_atomically(path: str, content: str) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpuinfra_slurm.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sinfo", default="sinfo")
    parser.add_argument("--output", required=True)
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    try:
        done = subprocess.run(
            [args.sinfo, "--noheader", "--Node", f"--format={SINFO_FORMAT}"],
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=True,
        )
        nodes: dict[str, dict[str, object]] | None = parse(done.stdout)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"sinfo failed: {exc}", file=sys.stderr)
        nodes = None
    write_atomically(args.output, render(nodes))
    return 0 if nodes is not None else 1


if __name__ == "__main__":
    sys.exit(main())
