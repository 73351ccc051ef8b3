"""`gpuinfra apply`: the probe first, then site.yml for the hosts it leaves work for.

Ansible loads every play and role of a playbook before it runs the first task. For site.yml that is about a second
of the controller's CPU, more than the whole no-op of a small cluster. So a re-apply runs playbooks/pending.yml first:
the receipts' probe (playbooks/receipts.yml), then Ansible's own host patterns, the same as site.yml's plays, matched
against the fresh groups the probe filled. When they match no host, nothing has changed and the apply is done.
Otherwise site.yml runs for those hosts only (a limit), and probes them again as its first play: it is still the
whole site.yml, just without the hosts every play of it would leave out anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from .errors import Refused
from .progress import HostStats
from .render.applicable import applicable
from .render.inventory import inventory_yaml
from .run import DEFAULT_PLAYBOOK, OnUpdate, Outcome, RunOptions, RunResult, playbook_path, run_playbook
from .targets import target_hosts
from .validate.load import LoadedCluster

PENDING_PLAYBOOK = "pending.yml"
PATTERNS = "gpuinfra_site_patterns"
PENDING = "gpuinfra_pending"
FULL = "gpuinfra_full"
_FINISHED = (Outcome.OK, Outcome.CHANGED, Outcome.FAILED)  # the outcomes of a run that ran to its end, worst last
_IMPORT = ("ansible.builtin.import_playbook", "import_playbook")


def _imports(playbook: Path) -> Iterator[tuple[Path | None, dict[str, Any]]]:
    """(the file it imports, or None for a play; the entry) for each entry of a playbook."""
    for entry in YAML(typ="safe").load(playbook.read_text()) or []:
        imported = next((entry[key] for key in _IMPORT if key in entry), None)
        yield (None if imported is None else (playbook.parent / str(imported)).resolve()), entry


def _plays(playbook: Path, skip: frozenset[Path]) -> Iterator[dict[str, Any]]:
    for imported, entry in _imports(playbook):
        if imported is None:
            yield entry
        elif imported not in skip:
            yield from _plays(imported, skip)


@cache
def site_patterns(site: Path, pending: Path) -> tuple[str, ...] | None:
    """The hosts pattern of every play of `site` (following its imports), less the playbooks `pending` imports too
    (the probe, which has run), or None when one is not a plain pattern (a template, which only the run could
    evaluate): then every host goes to site.yml."""
    skip = frozenset(imported for imported, _ in _imports(pending) if imported is not None)
    patterns: list[str] = []
    for play in _plays(site, skip):
        hosts = play.get("hosts")
        for pattern in hosts if isinstance(hosts, list) else [hosts]:
            if not isinstance(pattern, str) or not pattern or "{" in pattern:
                return None
            patterns.append(pattern)
    return tuple(patterns)


@dataclass(frozen=True)
class ApplyPlan:
    """What `gpuinfra apply` would run, known before it asks: the inventory (every role variable, computed once and
    handed to the run as it is), the hosts the limit matches, and how many configuration files the model renders."""

    cluster: str
    inventory: dict[str, Any]
    targets: list[str]
    hosts: int
    """Hosts in the cluster file, targeted or not."""
    node_groups: dict[str, tuple[tuple[str, ...], list[str]]]
    """Node group -> (its roles, its targeted hosts), for the groups with one."""
    files: int


def plan_apply(loaded: LoadedCluster, limit: str | None = None) -> ApplyPlan:
    """The plan of an apply; raises Refused when `limit` matches no host."""
    rc = loaded.resolved
    inventory = inventory_yaml(rc)
    targets = target_hosts(inventory, limit)
    if not targets:
        raise Refused(f"--limit {limit!r} matches no host of cluster {loaded.model.name!r}")
    wanted = set(targets)
    members: dict[str, list[str]] = {}
    for host in rc.hosts.values():  # one pass: a fleet has thousands of hosts
        if host.name in wanted:
            members.setdefault(host.group, []).append(host.name)
    node_groups: dict[str, tuple[tuple[str, ...], list[str]]] = {
        name: (tuple(group.roles), members[name]) for name, group in loaded.model.node_groups.items() if name in members
    }
    return ApplyPlan(loaded.model.name, inventory, targets, len(rc.hosts), node_groups, len(applicable(rc)))


def apply(
    inventory: Mapping[str, Any],
    options: RunOptions,
    *,
    hosts: list[str],
    on_update: OnUpdate | None = None,
    cancel: Callable[[], bool] | None = None,
) -> RunResult:
    """Run site.yml (options.playbook) on `hosts`, the targets, as `gpuinfra apply` does: see the module's doc.
    Any other playbook, and `--full`, run at once."""
    site = playbook_path(options.playbook)
    first = site.parent / PENDING_PLAYBOOK
    patterns = site_patterns(site, first) if site == playbook_path(DEFAULT_PLAYBOOK) and first.is_file() else None
    if patterns is None or options.extra_vars.get(FULL) or options.only:
        return run_playbook(inventory, options, hosts=hosts, on_update=on_update, cancel=cancel)
    probing = dataclasses.replace(options, playbook=first, extra_vars={**options.extra_vars, PATTERNS: list(patterns)})
    probe = run_playbook(inventory, probing, hosts=hosts, on_update=on_update, cancel=cancel)
    if probe.outcome in (Outcome.CANCELLED, Outcome.TIMEOUT):
        return probe
    pending = probe.artifacts.get(PENDING)
    if not isinstance(pending, list):  # no answer: no host passed the probe, and none would pass site.yml's either
        return probe
    failed = {name for name, stats in probe.hosts.items() if stats.failed or stats.unreachable}
    wanted = set(pending) - failed
    left = [host for host in hosts if host in wanted]
    if not left:
        return probe
    timeout = max(1, int(options.timeout - probe.duration_s)) if options.timeout else None
    rest = run_playbook(
        inventory,
        dataclasses.replace(options, limit=None, only=tuple(left), timeout=timeout),
        hosts=left,
        on_update=on_update,
        cancel=cancel,
    )
    return merged(probe, rest)


def merged(probe: RunResult, rest: RunResult) -> RunResult:
    """One result for the probe's run and site.yml's: each host's counts summed over both."""
    hosts = dict(probe.hosts)
    for name, stats in rest.hosts.items():
        both = HostStats(**probe.hosts[name].as_dict()) if name in probe.hosts else HostStats()
        for key, value in stats.as_dict().items():
            setattr(both, key, getattr(both, key) + value)
        hosts[name] = both
    outcome = rest.outcome
    if outcome in _FINISHED and probe.outcome in _FINISHED:
        outcome = max(outcome, probe.outcome, key=_FINISHED.index)
    return dataclasses.replace(
        rest,
        outcome=outcome,
        status=rest.status if probe.status == "successful" else probe.status,
        rc=rest.rc or probe.rc,
        hosts=hosts,
        failures=[*probe.failures, *rest.failures],
        changes=[*probe.changes, *rest.changes],
        errors=[*probe.errors, *rest.errors],
        warnings=[*probe.warnings, *rest.warnings],
        duration_s=probe.duration_s + rest.duration_s,
    )
