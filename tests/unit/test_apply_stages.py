"""`gpuinfra apply` probes first and runs site.yml only for the hosts its plays still match (gpuinfra/apply.py).

The stages run for real through ansible-runner, on the local connection, with stand-in playbooks: a pending.yml
that runs a stand-in probe (it puts hosts in the "fresh" groups it is told to, as the receipts' probe does) and then
asks the collection's matched_hosts filter; and a site.yml that runs the same probe, then plays that leave those
groups out and write a file per host."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from file_module import load
from ruamel.yaml import YAML

from gpuinfra.apply import apply, site_patterns
from gpuinfra.collection import ROOT
from gpuinfra.run import Outcome, RunOptions
from gpuinfra.run import playbook as run_module

matched_hosts = load("plugins/filter/hosts.py").matched_hosts

PROBE = """\
- name: Put each host in the fresh groups it is told to
  hosts: all
  gather_facts: false
  tasks:
    - name: Join them
      ansible.builtin.group_by: {key: "{{ item }}"}
      loop: "{{ [] if gpuinfra_full | default(false) else fresh[inventory_hostname] | default([]) }}"
      changed_when: false
"""

SITE = """\
- name: Probe
  ansible.builtin.import_playbook: probe.yml
- name: Write the first file
  hosts: compute:!fresh_a
  gather_facts: false
  tasks:
    - name: Write it
      ansible.builtin.copy: {dest: "{{ out }}/{{ inventory_hostname }}.a", content: "a\\n", mode: "0644"}
      delegate_to: localhost
- name: Write the second file
  hosts: compute:!fresh_b
  gather_facts: false
  tasks:
    - name: Write it
      ansible.builtin.copy: {dest: "{{ out }}/{{ inventory_hostname }}.b", content: "b\\n", mode: "0644"}
      delegate_to: localhost
"""

PENDING = """\
- name: Probe
  ansible.builtin.import_playbook: probe.yml
- name: Name the hosts site.yml still has work for
  hosts: all
  gather_facts: false
  tasks:
    - name: Match site.yml's patterns
      run_once: true
      ansible.builtin.set_stats:
        aggregate: false
        data:
          gpuinfra_pending: "{{ groups | gpuinfra.cluster.matched_hosts(gpuinfra_site_patterns) }}"
"""


def test_the_patterns_are_those_of_every_play_of_site_yml() -> None:
    yaml = YAML(typ="safe")
    plays = [
        play
        for entry in yaml.load((ROOT / "playbooks" / "site.yml").read_text())
        for play in yaml.load((ROOT / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text())
    ]
    patterns = site_patterns(ROOT / "playbooks" / "site.yml", ROOT / "playbooks" / "pending.yml")
    # All but the probe's (receipts.yml, with `hosts: all`), which pending.yml runs itself.
    assert patterns == tuple(play["hosts"] for play in plays[1:])
    assert plays[0]["name"].startswith("Compare each host's receipts")
    assert "gpu_nodes:!gpuinfra_fresh_nvidia_driver" in patterns


def test_a_templated_pattern_leaves_the_choice_to_site_yml(tmp_path: Path) -> None:
    (tmp_path / "inner.yml").write_text("- {name: p, hosts: compute, tasks: []}\n")
    (tmp_path / "site.yml").write_text(
        "- {name: a, ansible.builtin.import_playbook: inner.yml}\n- {name: b, hosts: '{{ wanted }}', tasks: []}\n"
    )
    (tmp_path / "pending.yml").write_text("- {name: p, hosts: all, tasks: []}\n")
    assert site_patterns(tmp_path / "site.yml", tmp_path / "pending.yml") is None


def test_each_pattern_is_matched_on_its_own() -> None:
    groups = {"all": ["n1", "n2", "n3"], "compute": ["n1", "n2"], "fresh_a": ["n1", "n2"], "fresh_b": ["n2"]}
    assert matched_hosts(groups, ["compute:!fresh_a", "compute:!fresh_b"]) == ["n1"]
    assert matched_hosts(groups, ["compute:!fresh_a"]) == []
    assert matched_hosts(groups, ["all:!compute", "compute:&fresh_b"]) == ["n2", "n3"]


def test_a_pattern_that_cannot_be_read_is_an_error_not_an_empty_answer() -> None:
    with pytest.raises(AnsibleFilterError, match="cannot match the host pattern"):
        matched_hosts({"all": ["n1"], "compute": ["n1"]}, ["~(unclosed"])


def _inventory(*names: str) -> dict[str, Any]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return {"all": {"hosts": dict.fromkeys(names, local), "children": {"compute": {"hosts": dict.fromkeys(names)}}}}


@pytest.fixture
def playbooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "playbooks"
    folder.mkdir()
    (folder / "site.yml").write_text(SITE)
    (folder / "pending.yml").write_text(PENDING)
    (folder / "probe.yml").write_text(PROBE)
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(run_module, "PLAYBOOKS", folder)
    return tmp_path / "out"


@pytest.mark.tools
def test_site_yml_runs_only_for_the_hosts_its_plays_still_match(run_root: Path, playbooks: Path) -> None:
    fresh = {"n1": ["fresh_a", "fresh_b"], "n2": ["fresh_a"], "n3": ["fresh_a", "fresh_b"]}
    options = RunOptions(extra_vars={"fresh": fresh, "out": str(playbooks)})
    result = apply(_inventory("n1", "n2", "n3"), options, hosts=["n1", "n2", "n3"])
    assert result.outcome is Outcome.CHANGED, result.failures
    assert sorted(path.name for path in playbooks.iterdir()) == ["n2.b"]
    assert result.playbook.name == "site.yml"
    # Each host ran the probe, and n1 the run_once question; n2 then ran site.yml: the probe again and one write.
    assert {name: (stats.ok, stats.changed) for name, stats in result.hosts.items()} == {
        "n1": (2, 0),
        "n2": (3, 1),
        "n3": (1, 0),
    }


@pytest.mark.tools
def test_nothing_left_to_do_runs_no_site_yml(run_root: Path, playbooks: Path) -> None:
    fresh = {name: ["fresh_a", "fresh_b"] for name in ("n1", "n2")}
    options = RunOptions(extra_vars={"fresh": fresh, "out": str(playbooks)})
    result = apply(_inventory("n1", "n2"), options, hosts=["n1", "n2"])
    assert result.outcome is Outcome.OK, result.failures
    assert list(playbooks.iterdir()) == []
    assert result.playbook.name == "pending.yml"


@pytest.mark.tools
def test_full_runs_site_yml_for_every_host(run_root: Path, playbooks: Path) -> None:
    fresh = {name: ["fresh_a", "fresh_b"] for name in ("n1", "n2")}
    options = RunOptions(extra_vars={"fresh": fresh, "out": str(playbooks), "gpuinfra_full": True})
    result = apply(_inventory("n1", "n2"), options, hosts=["n1", "n2"])
    assert result.outcome is Outcome.CHANGED, result.failures
    assert sorted(path.name for path in playbooks.iterdir()) == ["n1.a", "n1.b", "n2.a", "n2.b"]
    # site.yml alone: its probe (an empty loop, skipped) and two writes; no pending.yml before it.
    assert result.playbook.name == "site.yml"
    assert {(s.ok, s.changed, s.skipped) for s in result.hosts.values()} == {(2, 2, 1)}
