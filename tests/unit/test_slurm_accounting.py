"""The accounting tool of the slurm_accounting role: what it runs against a database, and what it leaves alone.

The "after" fixtures are real `sacctmgr -nP show ...` output, taken from the Molecule scenario's slurmdbd once the
role had applied molecule/slurm/vars/two_nodes.yml; planning against them must change nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "roles" / "slurm_accounting" / "files" / "gpuinfra_slurm_accounting.py"
FIXTURES = ROOT / "tests" / "unit" / "golden" / "slurm" / "sacctmgr"
WANTED = yaml.safe_load((ROOT / "molecule" / "slurm" / "vars" / "two_nodes.yml").read_text())
CLUSTER = WANTED["slurm_accounting_cluster_name"]


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("gpuinfra_slurm_accounting", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


acct = _load()


def have(name: str) -> list[dict[str, str]]:
    fields = {"qos": acct.QOS_FIELDS, "assoc": acct.ASSOC_FIELDS}[name]
    rows: list[dict[str, str]] = acct.parse_rows((FIXTURES / f"{name}.txt").read_text(), fields)
    return rows


def plan(
    have_qos: list[dict[str, str]], assocs: list[dict[str, str]], clusters: list[str] | None = None, **wanted: Any
) -> tuple[list[list[str]], list[str]]:
    result: tuple[list[list[str]], list[str]] = acct.plan(
        CLUSTER,
        wanted.get("qos", WANTED["slurm_accounting_qos"]),
        wanted.get("accounts", WANTED["slurm_accounting_accounts"]),
        [CLUSTER] if clusters is None else clusters,
        have_qos,
        assocs,
        wanted.get("root_qos"),
        wanted.get("preemptible"),
    )
    return result


def test_empty_database_gets_everything_in_order() -> None:
    normal = [{"name": "normal", "priority": "0", "preemptmode": "cluster"}]
    commands, unmanaged = plan(normal, [{"account": "root", "user": "", "parent": ""}], clusters=[])
    assert commands[0] == ["add", "cluster", CLUSTER]
    assert ["add", "qos", "onegpu"] in commands and ["add", "qos", "scavenger"] in commands
    assert ["add", "qos", "normal"] not in commands
    # Every QoS exists before any is modified (normal preempts scavenger).
    last_add = max(i for i, c in enumerate(commands) if c[:2] == ["add", "qos"])
    first_modify = min(i for i, c in enumerate(commands) if c[:2] == ["modify", "qos"])
    assert last_add < first_modify
    adds = [c[2] for c in commands if c[:2] == ["add", "account"]]
    assert adds == ["research", "teama", "teamb"]
    teamb = next(c for c in commands if c[:3] == ["add", "account", "teamb"])
    assert "parent=research" in teamb and "fairshare=40" in teamb and "defaultqos=onegpu" in teamb
    bob = ["add", "user", "bob", "account=teamb", f"cluster={CLUSTER}", "qos=onegpu,scavenger", "defaultqos=onegpu"]
    assert bob in commands
    onegpu = next(c for c in commands if c[:4] == ["modify", "qos", "where", "name=onegpu"])
    assert "MaxTRESPerUser=gres/gpu=1" in onegpu
    assert unmanaged == []


def test_applied_database_needs_nothing() -> None:
    commands, unmanaged = plan(have("qos"), have("assoc"))
    assert commands == []
    assert unmanaged == []


def test_changed_limit_modifies_only_that() -> None:
    qos = [dict(q) for q in WANTED["slurm_accounting_qos"]]
    next(q for q in qos if q["name"] == "onegpu")["max_gpus_per_user"] = 2
    commands, _ = plan(have("qos"), have("assoc"), qos=qos)
    assert commands == [["modify", "qos", "where", "name=onegpu", "set", "MaxTRESPerUser=gres/gpu=2"]]


def test_removed_limit_is_cleared() -> None:
    qos = [dict(q) for q in WANTED["slurm_accounting_qos"]]
    next(q for q in qos if q["name"] == "scavenger")["max_wall"] = None
    commands, _ = plan(have("qos"), have("assoc"), qos=qos)
    assert commands == [["modify", "qos", "where", "name=scavenger", "set", "MaxWall=-1"]]


def test_changed_share_and_parent() -> None:
    accounts = [dict(a) for a in WANTED["slurm_accounting_accounts"]]
    teama = next(a for a in accounts if a["name"] == "teama")
    teama.update(fairshare=70, parent="root")
    commands, _ = plan(have("qos"), have("assoc"), accounts=accounts)
    assert commands == [
        ["modify", "account", "where", "name=teama", f"cluster={CLUSTER}", "set", "Parent=root", "Fairshare=70"]
    ]


def test_a_removed_user_loses_the_association_and_a_removed_account_is_reported_not_deleted() -> None:
    accounts = [a for a in WANTED["slurm_accounting_accounts"] if a["name"] != "teamb"]
    accounts = [{**a, "users": []} if a["name"] == "teama" else a for a in accounts]
    qos = [q for q in WANTED["slurm_accounting_qos"] if q["name"] != "onegpu"]
    commands, unmanaged = plan(have("qos"), have("assoc"), qos=qos, accounts=accounts)
    assert commands == [["delete", "user", "where", "name=alice", "account=teama", f"cluster={CLUSTER}"]]
    assert unmanaged == ["qos onegpu", "account teamb"]


def test_root_gains_gpuinfras_check_qos_once_and_keeps_what_it_had() -> None:
    gpuinfra = {"name": "gpuinfra", "priority": 0, "preempt": [], "preempt_mode": "cluster"}
    qos = [*WANTED["slurm_accounting_qos"], gpuinfra]
    commands, unmanaged = plan(have("qos"), have("assoc"), qos=qos, root_qos=["gpuinfra"])
    assert commands == [
        ["add", "qos", "gpuinfra"],
        ["modify", "user", "where", "name=root", "account=root", f"cluster={CLUSTER}", "set", "QOS+=gpuinfra"],
    ]
    assert unmanaged == []
    granted = [
        {**row, "qos": "gpuinfra,normal"} if (row["account"], row["user"]) == ("root", "root") else row
        for row in have("assoc")
    ]
    have_qos = [*have("qos"), {"name": "gpuinfra", "priority": "0", "preemptmode": "cluster"}]
    assert plan(have_qos, granted, qos=qos, root_qos=["gpuinfra"]) == ([], [])
    # With the gate turned off, gpuinfra's QoS stays (its jobs' history names it) and is not reported.
    assert plan(have_qos, granted) == ([], [])


def test_every_other_qos_may_preempt_the_scheduled_checks_qos_slurms_normal_included() -> None:
    idle = {"name": "gpuinfra-idle", "priority": 0, "preempt": [], "preempt_mode": "cancel"}
    qos = [q for q in WANTED["slurm_accounting_qos"] if q["name"] != "normal"] + [idle]
    commands, _ = plan(have("qos"), have("assoc"), qos=qos, preemptible=["gpuinfra-idle"])
    assert commands[0] == ["add", "qos", "gpuinfra-idle"]
    modified = {c[3].removeprefix("name="): c[5:] for c in commands if c[:2] == ["modify", "qos"]}
    assert modified.pop("gpuinfra-idle") == ["PreemptMode=cancel"]
    # normal is Slurm's (not in this model): gpuinfra adds to its list and leaves the rest of it alone.
    assert modified.pop("normal") == ["Preempt+=gpuinfra-idle"]
    assert modified == {"onegpu": ["Preempt=gpuinfra-idle"], "scavenger": ["Preempt=gpuinfra-idle"]}


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [
        ("30:00", 1800),
        ("1:00:00", 3600),
        ("60", 3600),
        ("2-00:00:00", 172800),
        ("1-12", 129600),
        ("UNLIMITED", None),
        ("", None),
        (None, None),
    ],
)
def test_time_limits(limit: str | None, seconds: int | None) -> None:
    assert acct.seconds(limit) == seconds


def test_tres_parsing() -> None:
    assert acct.tres("cpu=4,gres/gpu=2") == {"cpu": "4", "gres/gpu": "2"}
    assert acct.tres("") == {}


def test_grace_time_is_set_in_seconds_and_read_back_in_slurms_form() -> None:
    scavenger = {"name": "scavenger", "preempt_grace_s": 30}
    assert acct.qos_changes(scavenger, {"name": "scavenger", "gracetime": "00:00:00"}) == ["GraceTime=30"]
    assert acct.qos_changes(scavenger, {"name": "scavenger", "gracetime": "00:00:30"}) == []
    assert acct.qos_changes({"name": "normal"}, {"name": "normal", "gracetime": "00:05:00"}) == ["GraceTime=0"]
