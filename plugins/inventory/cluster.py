# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The inventory of a gpuinfra cluster file, for ansible-playbook, ansible-inventory and AWX.

Everything here is Ansible plumbing: loading and checking the file, and the hosts, groups and variables, come from
the gpuinfra Python package, the same functions `gpuinfra inventory` and `gpuinfra apply` use.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any, NoReturn

from ansible import constants as C
from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.template import trust_as_template
from ansible.utils.unsafe_proxy import wrap_var

DOCUMENTATION = r"""
---
name: cluster
short_description: Hosts, groups and variables from a gpuinfra cluster file
version_added: "0.1.0"
author: gpuinfra maintainers
description:
  - Reads a gpuinfra cluster file, checks it as C(gpuinfra validate) does, and gives the same hosts, groups and
    variables as C(gpuinfra inventory) prints and C(gpuinfra apply) runs with; so C(ansible-playbook) and AWX
    run the collection's playbooks with the same inputs as C(gpuinfra apply).
  - "It reads two kinds of inventory source: a cluster file itself (a YAML file with a top-level C(node_groups)
    key and no C(plugin) key), for which the plugin must be enabled (C(enable_plugins) in the C([inventory])
    section of C(ansible.cfg), or E(ANSIBLE_INVENTORY_ENABLED)), ahead of C(ansible.builtin.yaml); or a source
    file with C(plugin: gpuinfra.cluster.cluster) and O(cluster_file), which Ansible's C(auto) plugin hands to
    this plugin without any setting, and which AWX inventory sources use."
  - "An invalid cluster file fails the source with every problem in it, one C(file:line:col: path: message) line
    each, and gives no hosts."
  - Every value from the cluster file is unsafe, so it is never templated, whatever it holds; only Ansible's own
    connection variables (C(ansible_host), C(ansible_user), ...) are plain strings.
requirements:
  - The gpuinfra Python package, of the same release as this collection, in the Python that runs Ansible.
options:
  plugin:
    description:
      - The name of this plugin, in a source file that points to a cluster file.
      - A cluster file itself has no C(plugin) key.
    type: str
    required: true
    choices: [gpuinfra.cluster.cluster]
  cluster_file:
    description:
      - The cluster file, in a source file that points to one.
      - A relative path is taken from the folder of the source file; C(~) is the home folder.
      - A source file names either this or O(inventory_file).
    type: str
  inventory_file:
    description:
      - An inventory that gpuinfra already made from a cluster file, as the JSON that C(gpuinfra inventory) prints;
        C(gpuinfra apply) writes one for each run and points its source file here.
      - It is read as it is, without checking the cluster file again, so a cluster of 10,000 hosts loads in a
        fraction of the time the cluster file or Ansible's YAML plugin take. It must be a regular file of at most
        256 MiB. Its content is data, never a template; the connection settings gpuinfra leaves plain are refused
        when they hold a template delimiter.
      - A relative path is taken from the folder of the source file; C(~) is the home folder.
    type: str
notes:
  - "Only what the cluster file decides is here. The settings C(gpuinfra apply) gives C(ansible-playbook) itself
    (C(gathering = smart), C(pipelining = true), C(unparsed_is_failed = true)) go in C(ansible.cfg); see the
    collection's C(docs/awx.md)."
  - Paths in the cluster file (SSH key, known_hosts file) are taken from the cluster file's folder, as by
    C(gpuinfra apply).
"""

EXAMPLES = r"""
# A cluster file is an inventory source of its own once the plugin is enabled, in ansible.cfg:
#   [inventory]
#   enable_plugins = gpuinfra.cluster.cluster, host_list, script, auto, ini
# then:
#   ansible-playbook -i inventories/sandbox/cluster.yml gpuinfra.cluster.site

# A source file that points to a cluster file (for AWX, or without enabling the plugin), e.g. sandbox.gpuinfra.yml:
plugin: gpuinfra.cluster.cluster
cluster_file: ../inventories/sandbox/cluster.yml
"""

# gpuinfra reads no more of a cluster file than this (gpuinfra.limits.MAX_FILE_BYTES), so neither does
# verify_file when it looks for the file's top-level keys.
SNIFF_BYTES = 128 * 1024
# The largest inventory_file read: 10,000 hosts take about 40 MiB.
MAX_INVENTORY_BYTES = 256 * 1024 * 1024
_TEMPLATE_STARTS = ("{{", "{%", "{#")
EXTENSIONS = (".yml", ".yaml", ".json")
# A key of the top-level mapping of a block-style YAML file: a line that starts with the key, quoted or not.
_TOP_LEVEL_KEY = re.compile(r"""^(?P<quote>["']?)(?P<key>[A-Za-z_][\w-]*)(?P=quote)[ \t]*:(?:[ \t]+(?P<value>.*))?$""")
_COMMENT = re.compile(r"[ \t]+#.*$")
CLUSTER_KEY = "node_groups"
PLUGIN_KEY = "plugin"
# Ansible's YAML inventory plugin takes a cluster file for an inventory of its own, with no hosts and a warning per
# key, when it gets the file after this plugin refused it.
_YAML_PLUGINS = ("yaml", "ansible.builtin.yaml", "ansible.legacy.yaml")


def top_level_keys(text: str) -> dict[str, str]:
    """The top-level keys of a YAML (block style) or JSON document, each with its value when the value is a
    scalar on the key's line (quotes and a trailing comment removed). Reads lines, never builds the document,
    except for JSON, which is parsed."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            return {}
        return (
            {str(key): value if isinstance(value, str) else "" for key, value in data.items()}
            if isinstance(data, dict)
            else {}
        )
    keys: dict[str, str] = {}
    for line in text.splitlines():
        found = _TOP_LEVEL_KEY.match(line)
        if found:
            value = _COMMENT.sub("", found.group("value") or "").strip()
            keys.setdefault(found.group("key"), value.strip("\"'"))
    return keys


def source_kind(path: str) -> str | None:
    """`cluster` for a cluster file, `source` for a source file naming this plugin, None for anything else.
    Cheap: the name, then at most SNIFF_BYTES of a regular file (so a FIFO is never opened)."""
    if not path.endswith(EXTENSIONS):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError:
        return None
    keys = top_level_keys(head.decode("utf-8", errors="replace"))
    if PLUGIN_KEY in keys:
        return "source" if keys[PLUGIN_KEY] == InventoryModule.NAME else None
    return "cluster" if CLUSTER_KEY in keys else None


def ansible_value(value: Any, key: str = "") -> Any:
    """A value of the inventory as gpuinfra renders it (`{"__ansible_unsafe": text}`, the JSON form of `!unsafe`,
    for every value from the cluster file) as Ansible holds it after reading that JSON from a file: unsafe text
    wrapped as unsafe. A string gpuinfra left plain (Ansible's own connection settings, which tools that connect
    take only as plain strings) is trusted when it holds no template, and refused when it does: gpuinfra never
    writes one, so it comes from a file made or changed by someone else."""
    if isinstance(value, dict):
        if list(value) == ["__ansible_unsafe"]:
            return wrap_var(value["__ansible_unsafe"])
        return {name: ansible_value(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [ansible_value(item, key) for item in value]
    if isinstance(value, str):
        if any(start in value for start in _TEMPLATE_STARTS):
            raise AnsibleParserError(f"{key or 'a value'} holds a template, which no inventory gpuinfra made does")
        return trust_as_template(value)
    return value


def _yaml_plugin_follows() -> bool:
    enabled = [str(name).strip() for name in C.INVENTORY_ENABLED]
    later = enabled[enabled.index(InventoryModule.NAME) + 1 :] if InventoryModule.NAME in enabled else []
    return any(name in _YAML_PLUGINS for name in later)


class InventoryModule(BaseInventoryPlugin):
    NAME = "gpuinfra.cluster.cluster"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and source_kind(path) is not None

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        if source_kind(path) == "source":
            self._read_config_data(path)
            named = {key: self.get_option(key) for key in ("cluster_file", "inventory_file") if self.get_option(key)}
            if len(named) != 1:
                raise AnsibleParserError(f"{path}: name either cluster_file or inventory_file, not {len(named)}")
            ((key, relative),) = named.items()
            given = os.path.normpath(os.path.join(os.path.dirname(path), os.path.expanduser(relative)))
            if key == "inventory_file":
                self._populate(self._rendered(given)["all"])
                return
            cluster_file = given
        else:
            cluster_file = path
        # Imported here, not at the top: a run's source names the JSON gpuinfra already wrote, and the package's
        # import (the model's classes) would only add to the start-up of every run.
        try:
            from gpuinfra.errors import GpuinfraError, InvalidInput
            from gpuinfra.render.inventory import inventory_yaml
            from gpuinfra.validate.load import load_cluster
        except ImportError as exc:
            raise AnsibleParserError(
                f"{self.NAME} needs the gpuinfra Python package, of the collection's release, in the Python that "
                f"runs Ansible ({sys.executable}); see the collection's docs/awx.md: {exc}"
            ) from exc
        try:
            loaded = load_cluster(cluster_file)
        except InvalidInput as exc:
            count = len(exc.errors)
            lines = [*(str(d) for d in exc.diagnostics), f"{cluster_file}: {count} error{'s' if count != 1 else ''}"]
            problem = "\n".join(lines)
        except GpuinfraError as exc:
            problem = f"{cluster_file}: {exc}"
        else:
            for warning in loaded.warnings:
                self.display.warning(str(warning))
            self._populate(inventory_yaml(loaded.resolved)["all"])
            return
        self._fail(problem, path)

    @staticmethod
    def _rendered(path: str) -> dict[str, Any]:
        """The JSON inventory gpuinfra wrote, read with the standard library: Ansible's loader would tag and then
        deep-copy every value, which is most of its time at 10,000 hosts."""
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # before open(), which blocks on a FIFO
                raise AnsibleParserError(f"cannot read the inventory {path}: not a regular file")
            with open(path, "rb") as handle:
                raw = handle.read(MAX_INVENTORY_BYTES + 1)
            if len(raw) > MAX_INVENTORY_BYTES:
                raise AnsibleParserError(f"cannot read the inventory {path}: over {MAX_INVENTORY_BYTES >> 20} MiB")
            data = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise AnsibleParserError(f"cannot read the inventory {path}: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("all"), dict):
            raise AnsibleParserError(f"{path} is not an inventory that gpuinfra made: it has no `all` group")
        return data

    def _fail(self, message: str, path: str) -> NoReturn:
        """Fail the source with `message`. Ansible shows a plugin's failure only when no later plugin takes the
        source; when the YAML plugin comes later and takes a cluster file (as a hostless inventory), the failure
        is shown here, so that it is never lost."""
        if source_kind(path) == "cluster" and _yaml_plugin_follows():
            self.display.error(f"{path} is not a valid cluster file, so it gives no hosts:\n{message}")
        raise AnsibleParserError(message)

    def _populate(self, all_group: dict[str, Any]) -> None:
        """The run directory's inventory (`all` with its vars, hosts and child groups), added as the YAML
        inventory plugin adds that file for `gpuinfra apply`: same order, same values."""
        self._set_variables("all", all_group.get("vars"))
        self._add_hosts("all", all_group.get("hosts"))
        for group, body in (all_group.get("children") or {}).items():
            if body.get("children"):
                raise AnsibleParserError(f"group {group} has groups of its own: gpuinfra's inventories have none")
            self.inventory.add_group(group)
            self._add_hosts(group, body.get("hosts"))
            self._set_variables(group, body.get("vars"))
            self.inventory.add_child("all", group)

    def _add_hosts(self, group: str, hosts: dict[str, Any] | None) -> None:
        for host, variables in (hosts or {}).items():
            self.inventory.add_host(host, group=group)
            self._set_variables(host, variables)

    def _set_variables(self, entity: str, variables: dict[str, Any] | None) -> None:
        for name, value in (variables or {}).items():
            self.inventory.set_variable(entity, name, ansible_value(value, name))
