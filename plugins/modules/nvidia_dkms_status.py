#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Report, for every installed kernel, whether a DKMS module is built and installed at a given version."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuinfra.cluster.plugins.module_utils.dkms import (
    DkmsEntry,
    installed_kernels,
    parse_dkms_status,
    version_key,
    version_matches,
)

DOCUMENTATION = r"""
---
module: nvidia_dkms_status
short_description: Report the DKMS state of the NVIDIA module for every installed kernel
version_added: "0.1.0"
description:
  - Lists the kernels installed on the host (C(/boot/vmlinuz-RELEASE) or C(/lib/modules/RELEASE/vmlinuz)),
    decides which one boots next, and reads C(dkms status) to tell, for each kernel, whether the DKMS module
    is C(installed) at the wanted version.
  - >-
    Understands the C(dkms status) formats of DKMS 2.x (C(name, version, kernel, arch: state)) and
    DKMS 3.x (C(name/version, kernel, arch: state)), including the notes DKMS adds in parentheses.
  - The kernel that boots next is, in this order, the O(next_boot) override, C(grubby --default-kernel) where
    grubby exists, the default entry of the GRUB configuration (C(GRUB_DEFAULT) as a number, a title, an id,
    a C(>) path into a submenu, or the saved or next entry of C(grubenv)), and otherwise the newest installed
    kernel by Debian version ordering, which is the order GRUB's generator sorts kernels in.
  - Never changes the host.
options:
  name:
    description: DKMS module name, e.g. C(nvidia-current) (Debian) or C(nvidia) (Ubuntu, NVIDIA's repositories).
    type: str
    required: true
  version:
    description:
      - Exact module version that must be installed, e.g. C(535.261.03).
      - When a branch is given instead (C(535)), any version C(535.*) counts.
    type: str
    required: true
  kernels:
    description:
      - Kernel releases to report. Empty means every installed kernel.
      - The next-boot kernel is always reported.
    type: list
    elements: str
    default: []
  next_boot:
    description: Kernel release that boots next, when it is known better than the host can tell.
    type: str
  boot_dir:
    description: Folder holding C(vmlinuz-RELEASE) files and the GRUB configuration.
    type: path
    default: /boot
  modules_dir:
    description: Folder holding one folder of modules per kernel release.
    type: path
    default: /lib/modules
  dkms_tree:
    description: DKMS tree, used to point at a failed build's log.
    type: path
    default: /var/lib/dkms
author:
  - gpuinfra maintainers
notes:
  - Supports check mode; it only reads.
"""

EXAMPLES = r"""
- name: Read the DKMS state of the NVIDIA module
  gpuinfra.cluster.nvidia_dkms_status:
    name: nvidia-current
    version: "535.261.03"
  register: dkms

- name: Show kernels without the module
  ansible.builtin.debug:
    msg: "{{ dkms.not_ready }}"

- name: Treat a kernel the host cannot detect as the next boot
  gpuinfra.cluster.nvidia_dkms_status:
    name: nvidia
    version: "550"
    next_boot: 6.8.0-45-generic
"""

RETURN = r"""
dkms_available:
  description: Whether the dkms command exists on the host.
  returned: always
  type: bool
dkms_stderr:
  description: What C(dkms status) wrote to standard error, if anything.
  returned: always
  type: str
entries:
  description: Every line of C(dkms status) for the module, parsed.
  returned: always
  type: list
  elements: dict
  sample: [{module: nvidia-current, version: 535.261.03, kernel: 6.1.0-28-amd64, arch: x86_64,
            state: installed, note: ""}]
installed_kernels:
  description: Releases of the kernels installed on the host, oldest first.
  returned: always
  type: list
  elements: str
next_boot:
  description: Kernel release that boots next (empty when no kernel is installed).
  returned: always
  type: str
next_boot_source:
  description: How the next-boot kernel was decided.
  returned: always
  type: str
  choices: [override, grubby, grub, newest, none]
kernels:
  description: One item per reported kernel, oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    release: {description: Kernel release., type: str}
    next_boot: {description: Whether this kernel boots next., type: bool}
    installed: {description: Whether the kernel image is installed (not only its headers)., type: bool}
    headers: {description: Whether the kernel's build folder (headers) is present., type: bool}
    state:
      description: DKMS state of the wanted version for this kernel; C(missing) when DKMS has no line for it.
      type: str
    ready: {description: Whether the wanted version is C(installed) for this kernel., type: bool}
    other_versions:
      description: Other versions of the module DKMS knows for this kernel, with their state.
      type: dict
    build_log: {description: Path of the DKMS build log for the wanted version, when a build left one., type: str}
not_ready:
  description: Releases of the reported kernels where the wanted version is not installed.
  returned: always
  type: list
  elements: str
next_boot_ready:
  description: Whether the wanted version is installed for the kernel that boots next.
  returned: always
  type: bool
summary:
  description: One line per reported kernel, for people.
  returned: always
  type: list
  elements: str
  sample: ["6.1.0-28-amd64: nvidia-current/535.261.03 installed (boots next)"]
"""


_MENU_OPEN = re.compile(r"^\s*(menuentry|submenu)\s+(?P<rest>.*)\{\s*$")
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"|(\S+)")
_LINUX = re.compile(r"^\s*linux(?:efi|16)?\s+(?P<path>\S+)")


def _menu_words(rest: str) -> tuple[str, str]:
    """Title and id of a `menuentry`/`submenu` line."""
    words = [next(group for group in m.groups() if group is not None) for m in _QUOTED.finditer(rest)]
    title = words[0] if words else ""
    entry_id = ""
    for index, word in enumerate(words[:-1]):
        if word in ("--id", "$menuentry_id_option", "${menuentry_id_option}"):
            entry_id = words[index + 1]
    return title, entry_id


def parse_grub_menu(text: str) -> list[dict[str, Any]]:
    """Top-level GRUB menu: [{title, id, release, children}] where submenus carry children."""
    root: list[dict[str, Any]] = []
    stack: list[list[dict[str, Any]]] = [root]
    current: list[dict[str, Any]] = []  # open menu items, innermost last
    depth_markers: list[dict[str, Any] | None] = []  # one per open brace; None for blocks such as `if`
    for line in text.splitlines():
        stripped = line.strip()
        opened = _MENU_OPEN.match(line)
        if opened:
            title, entry_id = _menu_words(opened.group("rest"))
            item: dict[str, Any] = {"title": title, "id": entry_id, "release": "", "children": []}
            stack[-1].append(item)
            depth_markers.append(item)
            current.append(item)
            if opened.group(1) == "submenu":
                stack.append(item["children"])
            continue
        if stripped.endswith("{"):
            depth_markers.append(None)
            continue
        if stripped == "}" and depth_markers:
            closed = depth_markers.pop()
            if closed is not None:
                current.pop()
                if stack[-1] is closed["children"] and len(stack) > 1:
                    stack.pop()
            continue
        linux = _LINUX.match(line)
        if linux and current:
            base = os.path.basename(linux.group("path"))
            if base.startswith("vmlinuz-"):
                current[-1]["release"] = base[len("vmlinuz-") :]
    return root


def _grubenv(path: str) -> dict[str, str]:
    values = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and not key.startswith("#"):
                    values[key] = value
    except OSError:
        pass
    return values


def grub_default_selector(cfg_text: str, env: dict[str, str]) -> str:
    """The entry GRUB boots without a keypress: next_entry, then the default set in grub.cfg."""
    if env.get("next_entry"):
        return env["next_entry"]
    default = "0"
    for match in re.finditer(r"^\s*set\s+default=[\"']?([^\"'\n]*)[\"']?\s*$", cfg_text, re.M):
        value = match.group(1).strip()
        if value in ("${saved_entry}", "$saved_entry"):
            saved = env.get("saved_entry", "")
            if saved:
                return saved
            continue
        if value.startswith("$"):
            continue
        default = value
        break
    return default


def resolve_grub_entry(menu: list[dict[str, Any]], selector: str) -> str:
    """Kernel release of the entry a GRUB default (`0`, `1>2`, a title or an id) selects; empty if unknown."""
    items = menu
    chosen: dict[str, Any] | None = None
    for part in selector.split(">"):
        part = part.strip()
        chosen = None
        if part.isdigit():
            if int(part) < len(items):
                chosen = items[int(part)]
        else:
            chosen = next((item for item in items if part in (item["title"], item["id"])), None)
        if chosen is None:
            return ""
        items = chosen["children"]
    if chosen is None:
        return ""
    if chosen["children"]:
        # A submenu chosen on its own boots its first entry.
        return resolve_grub_entry(chosen["children"], "0")
    return str(chosen["release"])


def next_boot_kernel(module: AnsibleModule | None, boot_dir: str, kernels: list[str]) -> tuple[str, str]:
    if module is not None and boot_dir == "/boot":
        grubby = shutil.which("grubby")
        if grubby:
            rc, out, _ = module.run_command([grubby, "--default-kernel"])
            base = os.path.basename(out.strip())
            if rc == 0 and base.startswith("vmlinuz-"):
                return base[len("vmlinuz-") :], "grubby"
    for cfg in ("grub/grub.cfg", "grub2/grub.cfg"):
        path = os.path.join(boot_dir, cfg)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        env = _grubenv(os.path.join(os.path.dirname(path), "grubenv"))
        release = resolve_grub_entry(parse_grub_menu(text), grub_default_selector(text, env))
        if release:
            return release, "grub"
    if kernels:
        return kernels[-1], "newest"
    return "", "none"


def kernel_report(
    releases: list[str],
    installed: list[str],
    next_boot: str,
    entries: list[DkmsEntry],
    name: str,
    version: str,
    modules_dir: str,
    dkms_tree: str,
) -> list[dict[str, Any]]:
    report = []
    for release in releases:
        mine = [e for e in entries if e.module == name and e.kernel == release]
        wanted = [e for e in mine if version_matches(e.version, version)]
        state = "missing"
        if any(e.state == "installed" for e in wanted):
            state = "installed"
        elif wanted:
            state = wanted[0].state
        item: dict[str, Any] = {
            "release": release,
            "next_boot": release == next_boot,
            "installed": release in installed,
            "headers": os.path.isdir(os.path.join(modules_dir, release, "build")),
            "state": state,
            "ready": state == "installed",
            "other_versions": {e.version: e.state for e in mine if not version_matches(e.version, version)},
            "build_log": "",
        }
        if state != "installed" and "." in version:
            log = os.path.join(dkms_tree, name, version, "build", "make.log")
            if os.path.isfile(log):
                item["build_log"] = log
        report.append(item)
    return report


def summary_lines(report: list[dict[str, Any]], name: str, version: str) -> list[str]:
    lines = []
    for k in report:
        notes = []
        if k["next_boot"]:
            notes.append("boots next")
        if not k["installed"]:
            notes.append("headers only, no kernel image")
        elif not k["headers"]:
            notes.append("no headers")
        notes.extend(f"{v} {state}" for v, state in sorted(k["other_versions"].items()))
        if k["build_log"]:
            notes.append(f"log {k['build_log']}")
        suffix = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"{k['release']}: {name}/{version} {k['state']}{suffix}")
    return lines


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "kernels": {"type": "list", "elements": "str", "default": []},
            "next_boot": {"type": "str"},
            "boot_dir": {"type": "path", "default": "/boot"},
            "modules_dir": {"type": "path", "default": "/lib/modules"},
            "dkms_tree": {"type": "path", "default": "/var/lib/dkms"},
        },
        supports_check_mode=True,
    )
    params = module.params
    installed = installed_kernels(params["boot_dir"], params["modules_dir"])
    if params["next_boot"]:
        next_boot, source = params["next_boot"], "override"
    else:
        next_boot, source = next_boot_kernel(module, params["boot_dir"], installed)

    dkms = shutil.which("dkms") or next((p for p in ("/usr/sbin/dkms", "/sbin/dkms") if os.access(p, os.X_OK)), None)
    stdout = stderr = ""
    if dkms:
        _, stdout, stderr = module.run_command([dkms, "status", "-m", params["name"]], environ_update={"LC_ALL": "C"})
    entries = parse_dkms_status(stdout)

    releases = list(params["kernels"]) or list(installed)
    if next_boot and next_boot not in releases:
        releases.append(next_boot)
    releases = sorted(set(releases), key=version_key)
    report = kernel_report(
        releases,
        installed,
        next_boot,
        entries,
        params["name"],
        params["version"],
        params["modules_dir"],
        params["dkms_tree"],
    )
    module.exit_json(
        changed=False,
        dkms_available=bool(dkms),
        dkms_stderr=stderr.strip(),
        entries=[entry.__dict__ for entry in entries],
        installed_kernels=installed,
        next_boot=next_boot,
        next_boot_source=source,
        kernels=report,
        not_ready=[k["release"] for k in report if not k["ready"]],
        next_boot_ready=any(k["ready"] and k["next_boot"] for k in report),
        summary=summary_lines(report, params["name"], params["version"]),
    )


if __name__ == "__main__":
    main()
