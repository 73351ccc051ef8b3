"""What a GPU node should be, from its inventory variables; helpers shared by the testinfra suite.

Run against real nodes, for example:

    pytest tests/infra --hosts=ansible://gpu_nodes --ansible-inventory=.gpuinfra/run/inventory.yml
    pytest tests/infra --hosts=ssh://gpu01,ssh://gpu02 --ansible-inventory=inventory.yml --sudo

Expected values (the driver pin, the GPU count, MIG layouts, the health policy) come from each host's inventory
variables, as gpuinfra renders them or as a plain inventory sets them for the roles.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _plain(value: Any) -> Any:
    """An inventory value with Ansible's unsafe marks taken off: gpuinfra's inventory hands every value to Ansible
    as data (`{"__ansible_unsafe": "535.261.03"}` in ansible-inventory's JSON), and this suite only compares them."""
    if isinstance(value, dict):
        if list(value) == ["__ansible_unsafe"]:
            return value["__ansible_unsafe"]
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _concrete(value: Any) -> Any:
    """An inventory value, or None where it is an unrendered template (only Ansible can evaluate it)."""
    if isinstance(value, str) and "{{" in value:
        return None
    return value


@dataclass(frozen=True)
class Expected:
    """The node as the inventory describes it. Empty or zero fields are not known."""

    host: str
    pin: str = ""
    gpu_count: int = 0
    mig_layouts: dict[str, str] = field(default_factory=dict)
    dkms_module: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)

    def need_pin(self) -> str:
        if not self.pin:
            pytest.skip(
                f"{self.host}: no driver pin in the inventory (gpu_health_driver_version, nvidia_driver_version "
                "or nvidia_driver_branch)"
            )
        return self.pin

    def need_gpu_count(self) -> int:
        if not self.gpu_count:
            pytest.skip(f"{self.host}: no GPU count in the inventory (gpuinfra_gpu_count)")
        return self.gpu_count


def expected_from(host: str, variables: dict[str, Any]) -> Expected:
    v = {key: _concrete(value) for key, value in variables.items()}
    pin = v.get("gpu_health_driver_version") or v.get("nvidia_driver_version") or ""
    if not pin and v.get("nvidia_driver_branch"):
        pin = str(v["nvidia_driver_branch"])
    count = v.get("gpuinfra_gpu_count") or v.get("gpu_health_expected_count") or 0
    layouts = v.get("gpuinfra_mig_layouts") or v.get("gpu_health_mig_layouts") or {}
    policy = {
        name: v[f"gpu_health_{name}"]
        for name in (
            "max_temperature_c",
            "max_uncorrectable_ecc",
            "allowed_xids",
            "require_persistence",
            "check_pcie_link",
        )
        if v.get(f"gpu_health_{name}") is not None
    }
    # The site's XID classes, keyed by number as the verdict reads them (an inventory's keys are strings).
    classes = v.get("gpu_health_xid_classes") or {}
    if classes:
        policy["xid_classes"] = {int(xid): str(kind) for xid, kind in dict(classes).items()}
    return Expected(
        host=host,
        pin=str(pin),
        gpu_count=int(count),
        mig_layouts={str(k): str(val) for k, val in dict(layouts).items() if val},
        dkms_module=v.get("gpu_health_dkms_module") or None,
        policy=policy,
    )


def _ansible_inventory() -> str:
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.exists() else (shutil.which("ansible-inventory") or "ansible-inventory")


@pytest.fixture(scope="module")
def inventory_vars(host: Any, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The host's variables: from the ansible:// backend, else from --ansible-inventory, else none."""
    backend = host.backend
    if callable(getattr(backend, "get_variables", None)):
        return {key: _plain(value) for key, value in backend.get_variables().items()}
    inventory = request.config.getoption("ansible_inventory", default=None)
    if not inventory:
        return {}
    name = backend.get_hostname()
    proc = subprocess.run(
        [_ansible_inventory(), "-i", inventory, "--host", name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"ansible-inventory cannot read host {name} from {inventory}: {proc.stderr.strip()}")
    variables: dict[str, Any] = _plain(json.loads(proc.stdout))
    return variables


@pytest.fixture(scope="module")
def expected(host: Any, inventory_vars: dict[str, Any]) -> Expected:
    name = host.backend.get_hostname()
    if not inventory_vars:
        pytest.skip(
            f"{name}: no inventory variables, so nothing to compare with; pass --ansible-inventory=FILE or "
            "--hosts=ansible://GROUP"
        )
    return expected_from(name, inventory_vars)


@pytest.fixture(scope="module")
def nvidia_gpus(host: Any) -> list[str]:
    """PCI addresses of the NVIDIA GPUs (display or 3D controllers; NVSwitches excluded) the host has."""
    script = (
        'for d in /sys/bus/pci/devices/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue; '
        'case "$(cat "$d/class")" in 0x0300*|0x0302*) echo "${d##*/}";; esac; done'
    )
    return [line for line in host.run(f"sh -c '{script}'").stdout.split() if line]
