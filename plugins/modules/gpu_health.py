#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Judge a GPU node's health from nvidia-smi, the kernel log, the nvidia kernel module and DKMS."""

from __future__ import annotations

import json
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuinfra.cluster.plugins.module_utils.node_probe import (
    KernelLog,
    ProbeOptions,
    Run,
    inspect,
    read_dmesg,
    read_journal,
)
from ansible_collections.gpuinfra.cluster.plugins.module_utils.verdict import Policy, failure_message
from ansible_collections.gpuinfra.cluster.plugins.module_utils.xid_catalog import CLASSES, XID_MAX
from ansible_collections.gpuinfra.cluster.plugins.module_utils.xid_log import parse_xid_log

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Check the health of a node's NVIDIA GPUs and report a per-GPU verdict
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi -q -x) once and reports, for every GPU, its index, name, UUID and PCI bus id with the
    reasons it is unhealthy, if any.
  - Per GPU it checks persistence mode, uncorrectable ECC errors since the driver loaded, pending or failed row
    remapping (Ampere and newer) or pending page retirement (older GPUs), the temperature, clock slowdowns caused by
    heat or the board (C(clocks_event_reasons), or C(clocks_throttle_reasons) on drivers before R550), the PCIe
    link width and generation against their maximum, the MIG mode (current and pending) against the layout the
    model assigns, and the XIDs the driver logged for that GPU since boot.
  - For the node it checks the GPU count, the driver version in use against the pin, the version of the nvidia
    kernel module C(modinfo) finds and of the loaded one, and that DKMS has the pinned module C(installed) for
    the running kernel and every installed kernel (so also for the kernel that boots next).
  - nvidia-smi missing, hung or failing (no driver loaded, C(Driver/library version mismatch), C(No devices were
    found)) is reported as a node problem, not an error of the module.
  - Never changes the host.
options:
  nvidia_smi:
    description: The nvidia-smi command, by name (looked up on C(PATH) and the sbin folders) or by path.
    type: str
    default: nvidia-smi
  timeout:
    description: Seconds nvidia-smi may take before it counts as hung (needs C(timeout) from coreutils).
    type: int
    default: 120
  expected_count:
    description: Number of GPUs the node must have. C(0) skips the check.
    type: int
    default: 0
  driver_version:
    description:
      - The pinned driver version, e.g. C(535.261.03); a branch such as C(535) accepts any C(535.*).
      - Empty skips every version check (driver in use, kernel module, DKMS).
    type: str
    default: ""
  max_temperature_c:
    description: Highest healthy GPU temperature, in degrees Celsius.
    type: int
    default: 85
  max_uncorrectable_ecc:
    description: Most uncorrectable ECC errors a GPU may have had since the driver loaded (volatile count).
    type: int
    default: 0
  allowed_xids:
    description:
      - XIDs that never make a GPU unhealthy, whatever their class; the same as class C(ignore) in O(xid_classes).
    type: list
    elements: int
    default: []
  xid_classes:
    description:
      - XID number to class, where the site overrides NVIDIA's XID catalog (the C(xid_catalog) module_util).
      - C(application) and C(ignore) never make a GPU unhealthy and are reported in RV(xid_reports); C(node),
        C(reset), C(reboot) and C(hardware) do. An XID neither here nor in the catalog is C(node).
      - The repetition rule (application XIDs from several jobs on one GPU) needs the checks' history, so only the
        node health program applies it, not this module.
    type: dict
    default: {}
  require_persistence:
    description: Whether persistence mode must be enabled on every GPU.
    type: bool
    default: true
  check_pcie_link:
    description:
      - Whether a PCIe link below its maximum width, or below its maximum generation while the GPU is busy, is
        a problem. Idle GPUs lower their link generation to save power, so an idle GPU's generation is not judged.
    type: bool
    default: true
  check_mig:
    description: Whether each GPU's MIG mode must match O(mig_layouts).
    type: bool
    default: true
  mig_layouts:
    description:
      - GPU index to MIG layout name. GPUs listed must have MIG enabled with MIG devices created; the others must
        have MIG disabled. A pending MIG mode change is a problem either way.
    type: dict
    default: {}
  check_xid:
    description: Whether to read the kernel log since boot (C(journalctl -k -b), else C(dmesg)) for NVRM XIDs.
    type: bool
    default: true
  check_kernel_module:
    description: Whether to compare C(modinfo -F version nvidia) and the loaded module's version with the pin.
    type: bool
    default: true
  check_dkms:
    description: Whether DKMS must have the pinned nvidia module C(installed) for every kernel in O(dkms_kernels).
    type: bool
    default: true
  dkms_module:
    description:
      - DKMS module name, e.g. C(nvidia-current) (Debian) or C(nvidia) (NVIDIA's and Ubuntu's repositories).
      - Unset accepts any of the names the NVIDIA driver packages use.
    type: str
  dkms_kernels:
    description:
      - Kernel releases DKMS is checked for.
      - Empty means every installed kernel (an image in C(/boot)) and the running kernel where C(/lib/modules/RELEASE)
        exists (in a container the running kernel is the host's).
    type: list
    elements: str
    default: []
  fail_on_unhealthy:
    description: Fail the task, naming every GPU and its reasons, when the node is unhealthy.
    type: bool
    default: true
  program:
    description:
      - The node health program (gpuinfra-health) to take the verdict from instead of judging here, for GPUs that
        only it can read (the sandbox's emulated GPUs, whose stand-in answers it reads with its own settings).
      - It runs with C(--read-only --json), so it keeps no state; the result has the same healthy, problems,
        node_problems and gpus keys. The other options are then unused.
    type: str
    default: ""
author:
  - gpuinfra maintainers
notes:
  - Supports check mode; it only reads.
  - Reading the kernel log and DKMS state usually needs root.
"""

EXAMPLES = r"""
- name: Check the GPUs of an 8-GPU node pinned to 535.261.03
  gpuinfra.cluster.gpu_health:
    expected_count: 8
    driver_version: "535.261.03"
    xid_classes: {43: node}

- name: Report without failing, MIG enabled on GPUs 0 and 1
  gpuinfra.cluster.gpu_health:
    mig_layouts: {"0": small-slices, "1": small-slices}
    fail_on_unhealthy: false
  register: health

- name: Show the unhealthy GPUs
  ansible.builtin.debug:
    msg: "{{ health.gpus | selectattr('problems') | map(attribute='index') | list }}"
"""

RETURN = r"""
healthy:
  description: Whether the node has no problem at all, and every check could look (RV(verdict) is C(healthy)).
  returned: always
  type: bool
verdict:
  description: C(healthy), C(unhealthy) (a problem found) or C(unknown) (none found, but a check could not look).
  returned: always
  type: str
unknown:
  description: What could not be looked at (a kernel log it cannot read, a tool missing or failing, the package
    manager's lock held past its limit).
  returned: always
  type: list
  elements: str
problems:
  description: Every problem, each prefixed with its GPU (C(GPU 3 (00000000:5D:00.0))) or with C(node).
  returned: always
  type: list
  elements: str
  sample: ["GPU 3 (00000000:5D:00.0): temperature 92 C is above the 85 C limit"]
node_problems:
  description: Problems of the node rather than of one GPU (nvidia-smi failing, count, versions, DKMS, XIDs of
    GPUs nvidia-smi does not list).
  returned: always
  type: list
  elements: str
gpus:
  description: One item per GPU nvidia-smi lists, in nvidia-smi's index order.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: nvidia-smi index., type: int}
    name: {description: Product name., type: str}
    uuid: {description: GPU UUID., type: str}
    pci_bus_id: {description: PCI bus id as nvidia-smi prints it., type: str}
    pci_device_id: {description: PCI device ID as the catalog writes it (C(0x2330)), or null., type: str}
    minor_number: {description: Minor number of the /dev/nvidiaN device., type: int}
    persistence_mode: {description: Enabled or Disabled., type: str}
    temperature_c: {description: GPU temperature., type: int}
    performance_state: {description: P-state, e.g. P0., type: str}
    ecc:
      description: ECC mode and uncorrectable error counts (volatile since the driver loaded, aggregate lifetime).
      type: dict
    remapped_rows:
      description: Row remapper state (Ampere and newer), null where the GPU has none.
      type: dict
    retired_pages:
      description: Page retirement state (older GPUs), null where not reported.
      type: dict
    clock_reasons: {description: Active clock event (throttle) reasons., type: list, elements: str}
    pcie: {description: Current and maximum PCIe link generation and width., type: dict}
    mig: {description: MIG mode (current, pending), MIG device count, assigned layout and expected mode., type: dict}
    xids:
      description: XID events of this GPU since boot (xid, pci, gpu_instance, message, pid, process, job, user).
      type: list
      elements: dict
    problems: {description: Reasons this GPU is unhealthy; empty when healthy., type: list, elements: str}
gpu_count:
  description: Number of GPUs nvidia-smi lists.
  returned: always
  type: int
expected_count:
  description: Number of GPUs expected, or null when not checked.
  returned: always
  type: int
driver_version:
  description: Driver version nvidia-smi reports, or null without a report.
  returned: always
  type: str
driver_pin:
  description: The pin the node was judged against (empty when none).
  returned: always
  type: str
nvidia_smi_rc:
  description: Exit code of nvidia-smi, or null when it is not installed.
  returned: always
  type: int
dtd:
  description: The DTD nvidia-smi names in its XML (its output format version), e.g. C(nvsmi_device_v12.dtd).
  returned: always
  type: str
kernel_log_source:
  description: Where XIDs were read from (C(journalctl -k -b) or C(dmesg)), or why they could not be.
  returned: always
  type: str
xid_events:
  description: Every NVRM XID in the kernel log since boot, allowed ones included.
  returned: always
  type: list
  elements: dict
  sample: [{xid: 79, pci: "0000:3b:00", gpu_instance: null, message: "GPU has fallen off the bus."}]
xid_reports:
  description:
    - The XIDs since boot whose class does not make a GPU unhealthy (C(application), C(ignore)), each with its class,
      GPU index, the pid and name of the process the driver named, and the message. What the host logged is data.
  returned: always
  type: list
  elements: dict
  sample: [{xid: 13, class: application, gpu: 0, pci: "0000:18:00", gpu_instance: null, pid: 4242,
            process: train.py, job: "", user: "", message: "pid=4242, name=train.py, Graphics Exception: ..."}]
kernel_module_version:
  description: Version of the nvidia module C(modinfo) finds for the running kernel, or null.
  returned: always
  type: str
loaded_module_version:
  description: Version of the loaded nvidia module (C(/sys/module/nvidia/version)), or null when not loaded.
  returned: always
  type: str
dkms_kernels:
  description: Kernel releases DKMS was checked for.
  returned: always
  type: list
  elements: str
dkms:
  description: Lines of C(dkms status) for NVIDIA modules, parsed.
  returned: always
  type: list
  elements: dict
"""

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "timeout": {"type": "int", "default": 120},
    "expected_count": {"type": "int", "default": 0},
    "driver_version": {"type": "str", "default": ""},
    "max_temperature_c": {"type": "int", "default": 85},
    "max_uncorrectable_ecc": {"type": "int", "default": 0},
    "allowed_xids": {"type": "list", "elements": "int", "default": []},
    "xid_classes": {"type": "dict", "default": {}},
    "require_persistence": {"type": "bool", "default": True},
    "check_pcie_link": {"type": "bool", "default": True},
    "check_mig": {"type": "bool", "default": True},
    "mig_layouts": {"type": "dict", "default": {}},
    "check_xid": {"type": "bool", "default": True},
    "check_kernel_module": {"type": "bool", "default": True},
    "check_dkms": {"type": "bool", "default": True},
    "dkms_module": {"type": "str"},
    "dkms_kernels": {"type": "list", "elements": "str", "default": []},
    "fail_on_unhealthy": {"type": "bool", "default": True},
    "program": {"type": "str", "default": ""},
}


def runner(module: AnsibleModule) -> Run:
    """node_probe's `run(argv) -> (rc, stdout, stderr)` through Ansible's run_command."""

    def run(argv: Any) -> tuple[int, str, str]:
        rc, out, err = module.run_command(list(argv), check_rc=False)
        return int(rc), str(out), str(err)

    return run


def read_kernel_log(module: AnsibleModule) -> KernelLog:
    """Kernel messages since boot: from the journal, else from dmesg."""
    run = runner(module)
    log = read_journal(run, module.get_bin_path)
    if log.text is None:
        fallback = read_dmesg(run, module.get_bin_path)
        if fallback.text is not None:
            return fallback
        return KernelLog(None, f"{log.source}; {fallback.source}")
    return log


def program_verdict(module: AnsibleModule, program: str) -> dict[str, Any]:
    """The node health program's own verdict (`--read-only --json`: it keeps no state, so the next periodic check
    still sees every XID), in this module's result shape. Only its structure is taken: its texts stay data."""
    rc, out, err = module.run_command([program, "--read-only", "--json"], check_rc=False)
    try:
        parsed = json.loads(out) if rc in (0, 1, 3) else None  # healthy, unhealthy, unknown
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        module.fail_json(msg=f"the node health program could not judge the node (exit code {rc}): {err or out}")
    verdict: dict[str, Any] = parsed if isinstance(parsed, dict) else {}  # fail_json has exited otherwise
    problems, unknown = verdict.get("problems"), verdict.get("unknown")
    return {
        "healthy": verdict.get("healthy") is True,
        "verdict": str(verdict.get("verdict") or ("healthy" if verdict.get("healthy") is True else "unhealthy")),
        "problems": [str(p) for p in problems] if isinstance(problems, list) else [],
        "unknown": [str(u) for u in unknown] if isinstance(unknown, list) else [],
        "node_problems": [str(p) for p in verdict.get("node_problems") or []],
        "gpus": verdict.get("gpus") if isinstance(verdict.get("gpus"), list) else [],
        "gpu_count": len(verdict.get("gpus") or []),
        "judged_by": program,
    }


def xid_classes(module: AnsibleModule, given: dict[Any, Any]) -> dict[int, str]:
    """The option's XID classes, keys as integers; every wrong entry named at once."""
    out: dict[int, str] = {}
    wrong = []
    for key, value in given.items():
        text = str(key).strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= XID_MAX):
            wrong.append(f"{key!r} is not an XID number (1 to {XID_MAX})")
        elif value not in CLASSES:
            wrong.append(f"XID {text}: {value!r} is not a class ({', '.join(CLASSES)})")
        else:
            out[int(text)] = value
    if wrong:
        module.fail_json(msg=f"xid_classes: {'; '.join(wrong)}")
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    p = module.params
    if p["program"]:
        verdict = program_verdict(module, p["program"])
        if p["fail_on_unhealthy"] and not verdict["healthy"]:
            module.fail_json(msg=failure_message(verdict), changed=False, **verdict)
        module.exit_json(changed=False, **verdict)
    policy = Policy(
        expected_count=p["expected_count"] or None,
        driver_version=(p["driver_version"] or "").strip(),
        max_temperature_c=p["max_temperature_c"],
        max_uncorrectable_ecc=p["max_uncorrectable_ecc"],
        allowed_xids=tuple(p["allowed_xids"]),
        xid_classes=xid_classes(module, p["xid_classes"] or {}),
        require_persistence=p["require_persistence"],
        check_pcie_link=p["check_pcie_link"],
        check_mig=p["check_mig"],
        mig_layouts={str(k): str(v) for k, v in (p["mig_layouts"] or {}).items() if v},
    )
    options = ProbeOptions(
        nvidia_smi=p["nvidia_smi"],
        timeout=p["timeout"],
        check_kernel_module=p["check_kernel_module"],
        check_dkms=p["check_dkms"],
        dkms_module=p["dkms_module"],
        dkms_kernels=p["dkms_kernels"],
    )
    run = runner(module)
    xid_events = []
    kernel_log_source = "not checked"
    blind = []
    if p["check_xid"]:
        log = read_kernel_log(module)
        kernel_log_source = log.source
        if log.text is None:
            blind.append(f"cannot read the kernel log, XIDs are unchecked ({log.source})")
        else:
            xid_events = parse_xid_log(log.text)

    # A gate passes on a healthy verdict only: `unknown` (a check could not look) fails it too.
    result: dict[str, Any] = inspect(run, module.get_bin_path, policy, options, xid_events, unknown=blind)
    result.update(changed=False, kernel_log_source=kernel_log_source)
    if p["fail_on_unhealthy"] and not result["healthy"]:
        module.fail_json(msg=failure_message(result), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
