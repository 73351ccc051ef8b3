#!/usr/bin/python3
"""Make Slurm's accounting database hold the cluster, QoS, accounts and users of a wanted state, with sacctmgr.

Usage: gpuinfra-slurm-accounting STATE.json [--check] [--bootstrap]

STATE.json holds {"cluster": NAME, "qos": [...], "accounts": [...], "root_qos": [...], "preemptible": [...]} (the
slurm_accounting role's variables).
The database is read with `sacctmgr -nP show ...` and only differences are applied, so a second run changes
nothing. Accounts, users and QoS that the database has and the state does not are reported, never deleted:
removing an account drops its usage history and fair-share. --bootstrap only registers the cluster and creates
missing QoS, without their limits: slurmctld refuses to start while a partition's QoS is missing, and QoS GPU
limits need the gres/gpu TRES that slurmctld registers when it starts. Prints one JSON object: changed,
commands (run, or that would run with --check) and unmanaged; exits 1 with a message on stderr when sacctmgr
fails.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from typing import Any

GPU = "gres/gpu"
# gpuinfra's QoS for its check jobs, and those never reported as unmanaged: Slurm's own and gpuinfra's (left when the
# checks are turned off: their jobs' history refers to them).
OWN_QOS = {"gpuinfra", "gpuinfra-idle"}
BUILTIN_QOS = {"normal", *OWN_QOS}


class SacctmgrError(Exception):
    pass


def parse_rows(text: str, fields: list[str]) -> list[dict[str, str]]:
    """Rows of `sacctmgr -nP show ... format=<fields>` (pipe separated, no header) as dicts."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append(dict(zip(fields, values + [""] * (len(fields) - len(values)), strict=False)))
    return rows


def tres(text: str) -> dict[str, str]:
    """`cpu=4,gres/gpu=2` -> {"cpu": "4", "gres/gpu": "2"}."""
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def names(text: str) -> list[str]:
    return sorted(n for n in (p.strip() for p in text.split(",")) if n)


def seconds(limit: str | None) -> int | None:
    """A Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], UNLIMITED) in seconds; None when unlimited."""
    if limit is None:
        return None
    text = str(limit).strip()
    if text in ("", "UNLIMITED", "INFINITE", "-1"):
        return None
    days = 0
    if "-" in text:
        day, text = text.split("-", 1)
        days = int(day)
        parts = [int(p) for p in text.split(":")] + [0, 0]
        hours, minutes, secs = parts[0], parts[1], parts[2]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, secs = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, secs = 0, parts[0], parts[1]
        else:
            hours, minutes, secs = parts[0], parts[1], parts[2]
    return ((days * 24 + hours) * 60 + minutes) * 60 + secs


def _count(value: Any) -> str:
    return "-1" if value in (None, "", 0) else str(int(value))


QOS_FIELDS = [
    "name",
    "priority",
    "maxtrespu",
    "maxtrespj",
    "maxjobspu",
    "maxwall",
    "preempt",
    "preemptmode",
    "gracetime",
]
QOS_FORMAT = "Name,Priority,MaxTRESPU,MaxTRES,MaxJobsPU,MaxWall,Preempt,PreemptMode,GraceTime"


def qos_changes(want: dict[str, Any], have: dict[str, str] | None) -> list[str]:
    """`key=value` settings that make the QoS `have` (None: missing) match `want`."""
    have = have or {}
    settings = []
    if str(want.get("priority") or 0) != (have.get("priority") or "0"):
        settings.append(f"Priority={int(want.get('priority') or 0)}")
    for key, field in (("max_gpus_per_user", "maxtrespu"), ("max_gpus_per_job", "maxtrespj")):
        wanted = _count(want.get(key))
        current = tres(have.get(field, "")).get(GPU, "-1")
        if wanted != current:
            name = "MaxTRESPerUser" if field == "maxtrespu" else "MaxTRESPerJob"
            settings.append(f"{name}={GPU}={wanted}")
    if _count(want.get("max_jobs_per_user")) != (have.get("maxjobspu") or "-1"):
        settings.append(f"MaxJobsPerUser={_count(want.get('max_jobs_per_user'))}")
    if seconds(want.get("max_wall")) != seconds(have.get("maxwall")):
        settings.append(f"MaxWall={want.get('max_wall') or -1}")
    if names(",".join(want.get("preempt") or [])) != names(have.get("preempt", "")):
        settings.append(f"Preempt={','.join(want.get('preempt') or []) or ''}")
    mode = (want.get("preempt_mode") or "cluster").lower()
    if mode != (have.get("preemptmode") or "cluster").lower():
        settings.append(f"PreemptMode={mode}")
    grace = int(want.get("preempt_grace_s") or 0)
    if grace != (seconds(have.get("gracetime")) or 0):
        settings.append(f"GraceTime={grace}")
    return settings


ASSOC_FIELDS = ["account", "user", "parent", "share", "qos", "defaultqos", "grptres"]
ASSOC_FORMAT = "Account,User,ParentName,Share,QOS,DefaultQOS,GrpTRES"


def account_changes(want: dict[str, Any], have: dict[str, str]) -> list[str]:
    """`key=value` settings that make an existing account association `have` match `want`."""
    settings = []
    if (want.get("parent") or "root") != (have.get("parent") or "root"):
        settings.append(f"Parent={want.get('parent') or 'root'}")
    if str(want.get("fairshare") or 1) != (have.get("share") or "1"):
        settings.append(f"Fairshare={int(want.get('fairshare') or 1)}")
    settings.extend(_qos_settings(want, have))
    if _count(want.get("max_gpus")) != tres(have.get("grptres", "")).get(GPU, "-1"):
        settings.append(f"GrpTRES={GPU}={_count(want.get('max_gpus'))}")
    return settings


def _qos_settings(want: dict[str, Any], have: dict[str, str]) -> list[str]:
    """QOS= and DefaultQOS= where the model names them (an empty list keeps what is inherited)."""
    settings = []
    wanted = sorted(want.get("qos") or [])
    if wanted and wanted != names(have.get("qos", "")):
        settings.append(f"QOS={','.join(wanted)}")
    default = want.get("default_qos") or ""
    if default and default != have.get("defaultqos", ""):
        settings.append(f"DefaultQOS={default}")
    return settings


def plan(
    cluster: str,
    qos: list[dict[str, Any]],
    accounts: list[dict[str, Any]],
    clusters: list[str],
    have_qos: list[dict[str, str]],
    assocs: list[dict[str, str]],
    root_qos: list[str] | None = None,
    preemptible: list[str] | None = None,
) -> tuple[list[list[str]], list[str]]:
    """The sacctmgr argument lists to run, in order, and what the database has beyond the wanted state. root_qos:
    QoS root's own association must also allow (added to what it has, never taken away); preemptible: QoS every
    other QoS may preempt, the ones the model lacks (Slurm's normal) included."""
    commands: list[list[str]] = []
    unmanaged: list[str] = []
    if cluster not in clusters:
        commands.append(["add", "cluster", cluster])

    by_qos = {row["name"]: row for row in have_qos}
    # Create every QoS before setting any (a QoS may preempt one defined after it).
    for want in qos:
        if want["name"] not in by_qos:
            commands.append(["add", "qos", want["name"]])
    preemptible = preemptible or []
    for want in qos:
        if want["name"] not in OWN_QOS:
            want = {**want, "preempt": [*(want.get("preempt") or []), *preemptible]}
        settings = qos_changes(want, by_qos.get(want["name"]))
        if settings:
            commands.append(["modify", "qos", "where", f"name={want['name']}", "set", *settings])
    wanted_qos = {q["name"] for q in qos}
    for name, row in sorted(by_qos.items()):
        missing = [q for q in preemptible if q not in names(row.get("preempt", ""))]
        if name not in wanted_qos | OWN_QOS and missing:
            commands.append(["modify", "qos", "where", f"name={name}", "set", f"Preempt+={','.join(missing)}"])
    unmanaged.extend(f"qos {name}" for name in sorted(by_qos) if name not in wanted_qos | BUILTIN_QOS)

    accounts_have = {row["account"]: row for row in assocs if not row["user"]}
    users_have = {(row["user"], row["account"]): row for row in assocs if row["user"]}
    for want in accounts:
        name = want["name"]
        have = accounts_have.get(name)
        if have is None:
            add = [
                "add",
                "account",
                name,
                f"cluster={cluster}",
                f"parent={want.get('parent') or 'root'}",
                f"description={want.get('description') or name}",
                f"fairshare={int(want.get('fairshare') or 1)}",
            ]
            if want.get("qos"):
                add.append(f"qos={','.join(sorted(want['qos']))}")
            if want.get("default_qos"):
                add.append(f"defaultqos={want['default_qos']}")
            if want.get("max_gpus"):
                add.append(f"grptres={GPU}={int(want['max_gpus'])}")
            commands.append(add)
        else:
            settings = account_changes(want, have)
            if settings:
                commands.append(["modify", "account", "where", f"name={name}", f"cluster={cluster}", "set", *settings])
        for user in want.get("users") or []:
            have_user = users_have.get((user, name))
            if have_user is None:
                add = ["add", "user", user, f"account={name}", f"cluster={cluster}"]
                if want.get("qos"):
                    add.append(f"qos={','.join(sorted(want['qos']))}")
                if want.get("default_qos"):
                    add.append(f"defaultqos={want['default_qos']}")
                commands.append(add)
            else:
                settings = _qos_settings(want, have_user)
                if settings:
                    commands.append(
                        [
                            "modify",
                            "user",
                            "where",
                            f"name={user}",
                            f"account={name}",
                            f"cluster={cluster}",
                            "set",
                            *settings,
                        ]
                    )

    root = users_have.get(("root", "root"))  # made with the cluster
    missing = [q for q in root_qos or [] if q not in names(root.get("qos", ""))] if root else []
    if missing:
        commands.append(
            [
                "modify",
                "user",
                "where",
                "name=root",
                "account=root",
                f"cluster={cluster}",
                "set",
                f"QOS+={','.join(missing)}",
            ]
        )

    wanted_accounts = {a["name"]: set(a.get("users") or []) for a in accounts}
    for account in sorted(accounts_have):
        if account != "root" and account not in wanted_accounts:
            unmanaged.append(f"account {account}")
    # A user taken out of a managed account loses the association, so that they can no longer submit there (their
    # finished jobs stay in the database; sacctmgr refuses while one of theirs runs, and the apply says so).
    for user, account in sorted(users_have):
        if account in wanted_accounts and user not in wanted_accounts[account]:
            commands.append(["delete", "user", "where", f"name={user}", f"account={account}", f"cluster={cluster}"])
        elif account == "root" and user != "root":
            unmanaged.append(f"user {user} in account root")
    return commands, unmanaged


def sacctmgr(*args: str) -> str:
    proc = subprocess.run(["sacctmgr", *args], capture_output=True, text=True, check=False)
    # sacctmgr says "Nothing new added" / "Nothing modified" with rc 1 when the state is already there.
    if proc.returncode != 0 and not re.search(r"Nothing (new added|modified)", proc.stdout + proc.stderr):
        raise SacctmgrError(f"sacctmgr {shlex.join(args)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def run(state: dict[str, Any], check: bool, bootstrap: bool = False) -> dict[str, Any]:
    cluster = state["cluster"]
    clusters = [row["name"] for row in parse_rows(sacctmgr("-nP", "show", "cluster", "format=Cluster"), ["name"])]
    if bootstrap:
        have = {row["name"] for row in parse_rows(sacctmgr("-nP", "show", "qos", "format=Name"), ["name"])}
        commands: list[list[str]] = [] if cluster in clusters else [["add", "cluster", cluster]]
        commands += [["add", "qos", q["name"]] for q in state.get("qos") or [] if q["name"] not in have]
        unmanaged: list[str] = []
    else:
        have_qos = parse_rows(sacctmgr("-nP", "show", "qos", f"format={QOS_FORMAT}"), QOS_FIELDS)
        assocs = parse_rows(
            sacctmgr("-nP", "show", "assoc", "where", f"cluster={cluster}", f"format={ASSOC_FORMAT}"), ASSOC_FIELDS
        )
        wanted_qos, wanted_accounts = state.get("qos") or [], state.get("accounts") or []
        commands, unmanaged = plan(
            cluster,
            wanted_qos,
            wanted_accounts,
            clusters,
            have_qos,
            assocs,
            state.get("root_qos") or [],
            state.get("preemptible") or [],
        )
    if not check:
        for args in commands:
            sacctmgr("-i", *args)
    return {"changed": bool(commands), "commands": [shlex.join(c) for c in commands], "unmanaged": unmanaged}


def main(argv: list[str]) -> int:
    flags = set(argv[2:])
    if len(argv) < 2 or not flags <= {"--check", "--bootstrap"}:
        print(f"usage: {argv[0]} STATE.json [--check] [--bootstrap]", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        state = json.load(f)
    try:
        result = run(state, check="--check" in flags, bootstrap="--bootstrap" in flags)
    except SacctmgrError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
