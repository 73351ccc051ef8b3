#!/usr/bin/python3
"""Write a Slurm gres.conf fragment with one line per MIG device present on this host.

Slurm without NVML (Debian's slurmd is built without it) needs each MIG device spelled out:

    Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap66,/dev/nvidia-caps/nvidia-cap67

that is the parent GPU's device file, then the device files of the slice's GPU instance and compute instance
capabilities. Their minors depend on the GPU instance IDs the driver assigned when the layout was applied, so
they are read from the host: the MIG devices and their instance IDs from `nvidia-smi -q -x`, their profiles from
`nvidia-smi -L`, and the capability minors from /proc/driver/nvidia-caps/mig-minors.

Installed by the gpuinfra mig role; run by gpuinfra-mig-apply after every change and at boot.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
LIST_GPU = re.compile(r"^GPU (\d+):")
LIST_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):")


class GresError(Exception):
    """The host's state cannot be turned into GRES lines."""


@dataclass(frozen=True)
class MigDevice:
    gpu_index: int
    gpu_minor: int
    device_index: int
    profile: str
    gpu_instance: int
    compute_instance: int


def parse_minors(text: str) -> dict[str, int]:
    """`gpu0/gi1/access 12` lines -> {"gpu0/gi1/access": 12}."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def parse_profiles(text: str) -> dict[int, dict[int, str]]:
    """`nvidia-smi -L` -> {GPU index: {MIG device index: profile}}."""
    out: dict[int, dict[int, str]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        match = LIST_GPU.match(line)
        if match:
            gpu = int(match.group(1))
            out[gpu] = {}
            continue
        match = LIST_MIG.match(line)
        if match and gpu is not None:
            out[gpu][int(match.group(2))] = match.group(1)
    return out


def _int(node: ET.Element, path: str) -> int:
    text = node.findtext(path)
    if text is None or not text.strip().isdigit():
        raise GresError(f"nvidia-smi -q -x: <{path}> is missing or not a number")
    return int(text.strip())


def parse_devices(xml_text: str, profiles: dict[int, dict[int, str]]) -> list[MigDevice]:
    """MIG devices from `nvidia-smi -q -x`, with their profiles from `nvidia-smi -L`."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise GresError(f"nvidia-smi -q -x is not XML: {exc}") from None
    devices: list[MigDevice] = []
    for gpu_index, gpu in enumerate(root.findall("gpu")):
        if (gpu.findtext("mig_mode/current_mig") or "").strip() != "Enabled":
            continue
        minor = _int(gpu, "minor_number")
        for mig in gpu.findall("mig_devices/mig_device"):
            index = _int(mig, "index")
            profile = profiles.get(gpu_index, {}).get(index)
            if profile is None:
                raise GresError(f"nvidia-smi -L lists no profile for GPU {gpu_index} MIG device {index}")
            devices.append(
                MigDevice(
                    gpu_index, minor, index, profile, _int(mig, "gpu_instance_id"), _int(mig, "compute_instance_id")
                )
            )
    return devices


def gres_lines(devices: list[MigDevice], minors: dict[str, int]) -> list[str]:
    lines: list[str] = []
    for dev in devices:
        gi = f"gpu{dev.gpu_minor}/gi{dev.gpu_instance}/access"
        ci = f"gpu{dev.gpu_minor}/gi{dev.gpu_instance}/ci{dev.compute_instance}/access"
        for name in (gi, ci):
            if name not in minors:
                raise GresError(f"{MIG_MINORS} has no entry {name}")
        files = [
            f"/dev/nvidia{dev.gpu_minor}",
            f"/dev/nvidia-caps/nvidia-cap{minors[gi]}",
            f"/dev/nvidia-caps/nvidia-cap{minors[ci]}",
        ]
        lines.append(f"Name=gpu Type={dev.profile} MultipleFiles={','.join(files)}")
    return lines


def render(devices: list[MigDevice], minors: dict[str, int]) -> str:
    header = [
        "# Written by gpuinfra-mig-slurm-gres from the MIG devices present; regenerated after every MIG change",
        "# and at boot. Do not edit.",
    ]
    body: list[str] = []
    for dev in devices:
        body.append(
            f"# GPU {dev.gpu_index} MIG device {dev.device_index}: {dev.profile}, "
            f"GPU instance {dev.gpu_instance}, compute instance {dev.compute_instance}"
        )
        body.extend(gres_lines([dev], minors))
    return "\n".join([*header, *body]) + "\n"


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise GresError(f"{argv[0]} is not installed") from None
    except subprocess.CalledProcessError as exc:
        raise GresError(
            f"{' '.join(argv)} failed ({exc.returncode}): {exc.stderr.strip() or exc.stdout.strip()}"
        ) from None


def write_if_changed(path: Path, content: str) -> bool:
    if path.exists() and path.read_text() == content:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.") as tmp:
        tmp.write(content)
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="file to write (default: print)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi to run")
    parser.add_argument("--query-xml", help="read `nvidia-smi -q -x` output from this file instead")
    parser.add_argument("--list", help="read `nvidia-smi -L` output from this file instead")
    parser.add_argument("--mig-minors", default=MIG_MINORS, help=f"capability minors (default {MIG_MINORS})")
    args = parser.parse_args(argv)
    try:
        xml_text = Path(args.query_xml).read_text() if args.query_xml else _run([args.nvidia_smi, "-q", "-x"])
        list_text = Path(args.list).read_text() if args.list else _run([args.nvidia_smi, "-L"])
        try:
            minors = parse_minors(Path(args.mig_minors).read_text())
        except OSError as exc:
            raise GresError(f"cannot read {args.mig_minors}: {exc.strerror}") from None
        content = render(parse_devices(xml_text, parse_profiles(list_text)), minors)
    except GresError as exc:
        print(f"gpuinfra-mig-slurm-gres: {exc}", file=sys.stderr)
        return 1
    if args.output:
        changed = write_if_changed(Path(args.output), content)
        print(f"gpuinfra-mig-slurm-gres: {args.output} {'changed' if changed else 'unchanged'}")
    else:
        sys.stdout.write(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
