"""Fresh converge of one GPU node against the floor: the bare `apt-get install` of the same packages.

Two identical fresh systemd containers start from the base image with the archive's kernel installed (not timed).
In one, the gpu_node playbook runs (preflight, driver with its real DKMS build, pin, hold, nouveau blacklist and
initramfs, the kernel gate, the container toolkit's configuration); in the other, `apt-get update` and one
`apt-get install` of the same packages at the same pinned version. Prints both wall times and the ratio from this
one run (target: at most 1.25). The two runs go one after the other so that they do not share the CPUs.

NVIDIA's container toolkit repository cannot be reached here, so the toolkit packages are in neither run.

    .venv/bin/python benchmarks/gpu_node_converge.py [--image localhost/gpuinfra-debian12] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "535.261.03"
# What the nvidia_driver role installs on Debian 12 (tests/unit/test_driver_vars.py checks the role's lists):
# DKMS, the headers of every installed kernel, the driver packages at the pin, and the persistence daemon.
DRIVER_PACKAGES = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "libnvidia-cfg1"]
OTHER_PACKAGES = ["dkms", "nvidia-persistenced"]
# The archive components and the pin the role writes, given to the floor before its clock starts.
SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
PIN = f"Package: *nvidia* libcuda* libnv*\nPin: version {VERSION}-*\nPin-Priority: 1001\n"
PLAYBOOK_VARS = {
    "nvidia_driver_version": VERSION,
    # No GPU in a container: nothing is loaded, started or rebooted.
    "nvidia_driver_service_manage": False,
    "nvidia_driver_reboot": "never",
    "nvidia_container_toolkit_install_packages": False,
}


def sh(*argv: str, stdin: str | None = None) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result.stdout


def start(name: str, image: str) -> str:
    """A fresh node: systemd container with the archive's kernel installed, as a real host has it."""
    subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, check=False)
    sh("podman", "run", "--detach", "--name", name, "--hostname", name, "--systemd=always", "--runtime=runc",
       "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", image, "/sbin/init")  # fmt: skip
    sh("podman", "exec", name, "bash", "-c",
       "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
       "linux-image-amd64 >/dev/null && apt-get clean")  # fmt: skip
    return sh("podman", "exec", name, "bash", "-c", "ls /lib/modules").split()[0]


def converge(name: str) -> tuple[float, list[tuple[str, float]]]:
    """The gpu_node playbook from this checkout against the container; returns its wall time and slowest tasks."""
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "ansible_collections" / "gpuinfra" / "cluster"
        link.parent.mkdir(parents=True)
        link.symlink_to(ROOT, target_is_directory=True)
        bundled = sh(
            sys.executable,
            "-c",
            "import ansible_collections, os; print(os.path.dirname(ansible_collections.__path__[0]))",
        )
        inventory = Path(tmp) / "inventory.yml"
        host = {"ansible_connection": "containers.podman.podman", "ansible_python_interpreter": "/usr/bin/python3"}
        inventory.write_text(json.dumps({"gpu_nodes": {"hosts": {name: host}, "vars": PLAYBOOK_VARS}}))
        env = {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": f"{tmp}:{bundled.strip()}",
            "ANSIBLE_NOCOLOR": "1",
            # As gpuinfra's runs do (gpuinfra/run/environment.py): a module in one exec, facts gathered once.
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_GATHERING": "smart",
            # Where the time goes: the slowest tasks, printed after the recap.
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
        }
        playbook = str(Path(sys.executable).parent / "ansible-playbook")
        began = time.monotonic()
        result = subprocess.run([playbook, "-i", str(inventory), str(ROOT / "playbooks" / "gpu_node.yml")],
                                env=env, capture_output=True, text=True, check=False)  # fmt: skip
        elapsed = time.monotonic() - began
    if result.returncode != 0:
        raise SystemExit(f"converge failed:\n{result.stdout[-5000:]}")
    # profile_tasks lines, slowest first: "role : Task name ------------ 12.34s" (a long name leaves one dash or none)
    profile = re.findall(r"(?m)^(.+?) -* +([0-9.]+)s$", result.stdout.split("PLAY RECAP")[-1])
    return elapsed, [(task, float(seconds)) for task, seconds in profile]


def floor(name: str, kernel: str) -> float:
    """`apt-get update` and one `apt-get install` of the same packages; returns its wall time."""
    sh("podman", "exec", "-i", name, "tee", "/etc/apt/sources.list.d/nonfree.sources", stdin=SOURCES)
    sh("podman", "exec", "-i", name, "tee", "/etc/apt/preferences.d/nvidia.pref", stdin=PIN)
    # The pin makes the driver version the candidate, as the role's pin does.
    packages = DRIVER_PACKAGES + OTHER_PACKAGES + [f"linux-headers-{kernel}"]
    command = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
    began = time.monotonic()
    sh("podman", "exec", name, "bash", "-c", command + " ".join(packages))
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="localhost/gpuinfra-debian12")
    parser.add_argument("--keep", action="store_true", help="leave the two containers for inspection")
    args = parser.parse_args()
    names = ("bench-gpunode-converge", "bench-gpunode-floor")
    try:
        kernel = start(names[0], args.image)
        start(names[1], args.image)
        converge_s, slowest = converge(names[0])
        floor_s = floor(names[1], kernel)
        modules = [
            sh("podman", "exec", n, "bash", "-c", f"dkms status -m nvidia-current -k {kernel}").strip() for n in names
        ]
    finally:
        if not args.keep:
            for name in names:
                subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, check=False)
    print(f"kernel {kernel}; driver {VERSION}")
    print(f"  converge (playbooks/gpu_node.yml): {converge_s:7.1f} s   dkms: {modules[0]}")
    print(f"  floor (apt-get update + install):  {floor_s:7.1f} s   dkms: {modules[1]}")
    print(f"  ratio: {converge_s / floor_s:.2f}x (target <= 1.25x)")
    total = sum(seconds for _, seconds in slowest)
    print(f"the converge's {len(slowest)} tasks took {total:.1f} s; the slowest:")
    for task, seconds in slowest[:10]:
        print(f"  {seconds:7.2f}s {task.strip()}")
    rest = slowest[10:]
    print(f"  {sum(s for _, s in rest):7.2f}s the other {len(rest)} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
