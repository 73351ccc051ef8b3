"""How package sources are trusted: the package_source role's, through which every role installs a vendor's packages
(the driver, the container toolkit, the DCGM exporter, Grafana, the MIG manager, the active checks' tools).

Three proofs, each with the real tool:
- apt's own `apt-get update` reads the .sources file each role renders for a local file:// mirror signed with a key
  generated here, and verifies the mirror's signature with the keyring the file names (a wrong key is refused; an
  unsigned mirror is read only when marked insecure);
- the roles' key check (the signing_key module) runs in ansible-playbook against real gpg, with the matching and a
  different fingerprint;
- the cluster file's fingerprint and insecure flag reach the roles' variables, which the roles declare.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ruamel.yaml import YAML
from test_driver_vars import _trusted

from gpuinfra.model import Cluster
from gpuinfra.render.vars import driver, monitoring, toolkit
from gpuinfra.resolve import resolve

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
FACTS = {"distribution": "Debian", "os_family": "Debian", "distribution_major_version": "12",
         "distribution_version": "12.11", "distribution_release": "bookworm", "architecture": "x86_64"}  # fmt: skip

# role -> (its .sources template, the prefix of its source variables, the settings it always needs)
SOURCES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "package_source": ("package-source.sources.j2", "package_source", {"package_source_name": "probe"}),
}


def _yaml(path: Path) -> dict[str, Any]:
    return (YAML(typ="safe").load(path.read_text()) or {}) if path.exists() else {}


def _templar(role: str, **overrides: Any) -> Templar:
    """The role's variables as a play sees them on Debian 12: defaults < overrides < vars/main.yml < vars/Debian.yml;
    an override of an internal (__) variable wins over the role's vars, as extra vars do."""
    layers = {**_yaml(ROLES / role / "defaults" / "main.yml"), **SOURCES.get(role, ("", "", {}))[2]}
    layers.update({k: v for k, v in overrides.items() if not k.startswith("__")})
    layers.update(_yaml(ROLES / role / "vars" / "main.yml"))
    layers.update(_yaml(ROLES / role / "vars" / "Debian.yml"))
    layers.update({k: v for k, v in overrides.items() if k.startswith("__")})
    variables = {**_trusted(layers), "ansible_facts": FACTS, "ansible_managed": "Managed by gpuinfra"}
    return Templar(loader=DataLoader(), variables=variables)


def render(role: str, **overrides: Any) -> str:
    template = (ROLES / role / "templates" / SOURCES[role][0]).read_text()
    return str(_templar(role, **overrides).template(trust_as_template(template)))


def value(role: str, name: str, **overrides: Any) -> Any:
    return _templar(role, **overrides).template(trust_as_template("{{ " + name + " }}"))


# --- a signed flat repository and keys, made with gpg -------------------------------------------------------------


def _gpg() -> str:
    path = shutil.which("gpg")
    if path is None:
        pytest.skip("gpg is not installed (apt-get install gpg): the key check runs the real gpg")
    return path


@pytest.fixture(scope="module")
def keys() -> Iterator[dict[str, Any]]:
    """Two signing keys generated with gpg in a private GNUPGHOME: the mirror's and another one."""
    gpg = _gpg()
    with tempfile.TemporaryDirectory(prefix="gpuinfra-keys-") as name:
        folder = Path(name)
        folder.chmod(0o755)  # apt's methods read the keyrings
        found: dict[str, Any] = {"dir": folder}
        for who in ("mirror", "other"):
            home = folder / f"gnupg-{who}"
            home.mkdir(mode=0o700)
            env = {**os.environ, "GNUPGHOME": str(home)}
            uid = f"gpuinfra test {who} <{who}@example.invalid>"
            subprocess.run(
                [gpg, "--batch", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never"],
                env=env,
                capture_output=True,
                check=True,
            )
            listing = subprocess.run(
                [gpg, "--batch", "--with-colons", "--list-keys"], env=env, capture_output=True, text=True, check=True
            ).stdout
            fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
            armored = folder / f"{who}.asc"
            armored.write_bytes(
                subprocess.run([gpg, "--batch", "--armor", "--export"], env=env, capture_output=True, check=True).stdout
            )
            binary = folder / f"{who}.gpg"
            binary.write_bytes(
                subprocess.run([gpg, "--batch", "--export"], env=env, capture_output=True, check=True).stdout
            )
            found[who] = {"home": home, "fingerprint": fingerprint, "asc": armored, "gpg": binary}
        yield found
        for who in ("mirror", "other"):  # gpg's agent for each home would outlive the folder
            env = {**os.environ, "GNUPGHOME": str(found[who]["home"])}
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True, check=False)


def _flat_repository(folder: Path, signing_home: Path | None) -> Path:
    """A flat apt repository (the layout of NVIDIA's repositories and their mirrors) with one package, its
    InRelease signed by the key in signing_home, or unsigned."""
    repo = folder / "repo"
    repo.mkdir()
    packages = (
        "Package: gpuinfra-probe\nVersion: 1.0\nArchitecture: all\nMaintainer: gpuinfra <t@example.invalid>\n"
        "Filename: ./gpuinfra-probe_1.0_all.deb\nSize: 1\nSHA256: " + "0" * 64 + "\nDescription: probe\n\n"
    )
    (repo / "Packages").write_text(packages)
    digest = hashlib.sha256(packages.encode()).hexdigest()
    release = f"Date: {formatdate(usegmt=True)}\nSHA256:\n {digest} {len(packages)} Packages\n"
    (repo / "Release").write_text(release)
    if signing_home is not None:
        subprocess.run(
            [_gpg(), "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
            env={**os.environ, "GNUPGHOME": str(signing_home)},
            capture_output=True,
            check=True,
        )
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repo


def _apt_update(folder: Path, sources: str) -> subprocess.CompletedProcess[str]:
    """apt-get update over only this .sources file, with private lists and cache: apt reads the file, fetches the
    repository and verifies its signature as it would on a host."""
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        pytest.skip("apt-get is not installed (apt's own parser and verifier check the rendered file)")
    parts = folder / "parts"
    (folder / "lists" / "partial").mkdir(parents=True)
    parts.mkdir()
    (parts / "gpuinfra.sources").write_text(sources)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    opts = {
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": str(parts),
        "Dir::State::Lists": str(folder / "lists"),
        "Dir::Cache": str(folder / "cache"),
        "Debug::NoLocking": "1",
        "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
    }
    argv = [apt_get, *[a for k, v in opts.items() if v for a in ("-o", f"{k}={v}")], "update"]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _mirror(role: str, url: str, keyring: str = "", fingerprint: str = "", insecure: bool = False) -> dict[str, Any]:
    prefix = SOURCES[role][1]
    return {
        f"{prefix}_type": "mirror",
        f"{prefix}_url": url,
        f"{prefix}_keyring": keyring,
        f"{prefix}_fingerprint": fingerprint,
        f"{prefix}_insecure": insecure,
    }


@pytest.mark.parametrize("role", list(SOURCES))
@pytest.mark.parametrize("form", ["asc", "gpg"])
def test_apt_verifies_a_signed_mirror_with_the_installed_keyring(
    tmp_path: Path, keys: dict[str, Any], role: str, form: str
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpuinfra-apt-"))
    try:
        repo = _flat_repository(folder, keys["mirror"]["home"])
        keyring = keys["mirror"][form]
        mirror = _mirror(role, f"file://{repo}/", f"files/mirror.{form}", keys["mirror"]["fingerprint"])
        installed = value(role, f"__{role}_apt_keyring", **mirror)
        assert installed.endswith(f".{form}"), "apt reads armored keys from .asc files and binary ones from .gpg"
        text = render(role, **mirror, **{f"__{role}_apt_keyring": str(keyring)})
        assert f"Signed-By: {keyring}\n" in text and "Trusted" not in text
        result = _apt_update(folder, text)
        assert result.returncode == 0 and "W:" not in result.stderr, result.stdout + result.stderr
        assert any(p.name.endswith("_Packages") or "_Packages." in p.name for p in (folder / "lists").iterdir())
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("role", list(SOURCES))
def test_apt_refuses_a_mirror_signed_by_another_key(keys: dict[str, Any], role: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpuinfra-apt-"))
    try:
        repo = _flat_repository(folder, keys["other"]["home"])
        mirror = _mirror(role, f"file://{repo}/", "files/mirror.asc", keys["mirror"]["fingerprint"])
        text = render(role, **mirror, **{f"__{role}_apt_keyring": str(keys["mirror"]["asc"])})
        result = _apt_update(folder, text)
        assert result.returncode != 0 and "is not signed" in result.stderr, result.stdout + result.stderr
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("role", list(SOURCES))
def test_an_unsigned_mirror_is_read_only_when_marked_insecure(role: str) -> None:
    for insecure in (False, True):
        folder = Path(tempfile.mkdtemp(prefix="gpuinfra-apt-"))
        try:
            repo = _flat_repository(folder, None)
            text = render(role, **_mirror(role, f"file://{repo}/", insecure=insecure))
            assert ("Trusted: yes\n" in text) is insecure
            assert "Signed-By" not in text
            result = _apt_update(folder, text)
            if insecure:
                assert result.returncode == 0, result.stdout + result.stderr
            else:
                assert result.returncode != 0 and "is not signed" in result.stderr, result.stderr
        finally:
            shutil.rmtree(folder)


# The libnvidia-container key (see the role's vars for its source); the driver's keys: test_driver_vars.py.
TOOLKIT_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"


def test_the_toolkits_repository_is_signed_by_its_pinned_key() -> None:
    """The toolkit hands its vendor repository to the package_source role, which checks that key."""
    fingerprint = _yaml(ROLES / "nvidia_container_toolkit" / "vars" / "main.yml")[
        "__nvidia_container_toolkit_repo_fingerprint"
    ]
    assert fingerprint == TOOLKIT_FINGERPRINT
    vendor = {
        "package_source_type": "vendor",
        "package_source_vendor_url": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
        "package_source_vendor_key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
        "package_source_vendor_fingerprint": fingerprint,
    }
    text = render("package_source", **vendor)
    keyring = value("package_source", "__package_source_apt_keyring", **vendor)
    assert keyring == "/etc/apt/keyrings/gpuinfra-probe.asc" and f"Signed-By: {keyring}\n" in text
    assert value("package_source", "__package_source_fingerprint", **vendor) == fingerprint


# --- the roles' check that a source is signed ---------------------------------------------------------------------


def _mirror_checks(role: str) -> list[tuple[Path, dict[str, Any]]]:
    """The role's tasks that refuse an unsigned mirror, and the files they are in."""
    return [
        (path, task)
        for path in sorted((ROLES / role / "tasks").glob("*.yml"))
        for task in YAML(typ="safe").load(path.read_text()) or []
        if str(task.get("name", "")).startswith("Check that the") and "insecure" in task["name"]
    ]


def _checks(role: str) -> tuple[Path, dict[str, Any]]:
    """The role's one task that refuses an unsigned mirror, and the file it is in."""
    [found] = _mirror_checks(role)
    return found


def test_the_supply_chain_rule_is_written_in_one_role() -> None:
    """Every role that installs a vendor's packages hands its source to package_source, the one role that refuses
    an unsigned mirror (beside the cluster file's loader, gpuinfra/validate/package_sources.py)."""
    roles = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())
    assert [r for r in roles if _mirror_checks(r)] == ["package_source"]


@pytest.mark.parametrize("role", list(SOURCES))
@pytest.mark.parametrize(
    ("url", "keyring", "fingerprint", "insecure", "accepted"),
    [
        ("https://mirror.example/nvidia/", "keys/m.asc", "A" * 40, False, True),
        ("file:///srv/mirror/", "keys/m.gpg", "0123456789ABCDEF0123456789ABCDEF01234567", False, True),
        ("https://mirror.example/nvidia/", "", "", False, False),  # no key
        ("https://mirror.example/nvidia/", "keys/m.asc", "", False, False),  # a key, not pinned
        ("https://mirror.example/nvidia/", "keys/m.asc", "a" * 40, False, False),  # not the canonical form
        ("https://mirror.example/nvidia/", "keys/m.asc", "A" * 16, False, False),  # a key id, not a fingerprint
        ("http://mirror.example/nvidia/", "keys/m.asc", "A" * 40, False, False),  # http
        ("http://mirror.example/nvidia/", "", "", True, True),  # loosened on purpose
        ("https://mirror.example/nvidia/", "keys/m.asc", "", True, False),  # a key is always pinned
    ],
)
def test_an_unsigned_mirror_is_refused_unless_insecure(
    role: str, url: str, keyring: str, fingerprint: str, insecure: bool, accepted: bool
) -> None:
    _, task = _checks(role)
    templar = _templar(role, **_mirror(role, url, keyring, fingerprint, insecure))
    conditions = task["ansible.builtin.assert"]["that"]
    results = [templar.evaluate_conditional(trust_as_template(c)) for c in conditions]
    assert all(results) is accepted, (conditions, results)


# --- the key check, against real gpg -----------------------------------------------------------------------------

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Check that the signing key is the pinned one
      gpuinfra.cluster.signing_key:
        path: "{{ key }}"
        fingerprint: "{{ pinned }}"
        origin: "{{ origin }}"
"""


def _check_key(tmp_path: Path, collections: Path, key: Path, pinned: str) -> subprocess.CompletedProcess[str]:
    """The signing_key module every role's key check calls, run by ansible-playbook on this machine with its gpg."""
    _gpg()
    variables = {
        "key": str(key),
        "pinned": pinned,
        "origin": f"files/{key.name}",
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    (tmp_path / "play.yml").write_text(PLAY)
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
    }
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"@{tmp_path / 'vars.json'}",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )


def _failure(result: subprocess.CompletedProcess[str]) -> str:
    """The message of the task that failed."""
    play = json.loads(result.stdout)
    for task in play["plays"][0]["tasks"]:
        host = task["hosts"].get("localhost", {})
        if host.get("failed"):
            return str(host.get("msg", ""))
    raise AssertionError("no task failed")


@pytest.mark.parametrize("form", ["asc", "gpg"])
def test_the_pinned_key_passes_the_check(tmp_path: Path, collections: Path, keys: dict[str, Any], form: str) -> None:
    result = _check_key(tmp_path, collections, keys["mirror"][form], keys["mirror"]["fingerprint"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [task] = json.loads(result.stdout)["plays"][0]["tasks"]
    assert task["hosts"]["localhost"]["fingerprints"] == [keys["mirror"]["fingerprint"]]
    assert task["hosts"]["localhost"]["changed"] is False


def test_a_different_key_fails_the_check_naming_both_fingerprints(
    tmp_path: Path, collections: Path, keys: dict[str, Any]
) -> None:
    result = _check_key(tmp_path, collections, keys["other"]["asc"], keys["mirror"]["fingerprint"])
    assert result.returncode != 0
    message = _failure(result)
    assert keys["other"]["fingerprint"] in message and keys["mirror"]["fingerprint"] in message, message
    assert "files/other.asc" in message and "not installed" in message
    assert "\n" not in message, "the message is one line"


def test_a_file_with_a_second_key_fails_the_check(tmp_path: Path, collections: Path, keys: dict[str, Any]) -> None:
    """A keyring that holds the pinned key and another would let apt trust both: refused."""
    both = tmp_path / "both.gpg"
    both.write_bytes(keys["mirror"]["gpg"].read_bytes() + keys["other"]["gpg"].read_bytes())
    result = _check_key(tmp_path, collections, both, keys["mirror"]["fingerprint"])
    assert result.returncode != 0
    message = _failure(result)
    assert f"{keys['mirror']['fingerprint']} and {keys['other']['fingerprint']}" in message, message


def test_a_file_that_is_no_key_fails_the_check_with_gpgs_words(
    tmp_path: Path, collections: Path, keys: dict[str, Any]
) -> None:
    page = tmp_path / "gpgkey"
    page.write_text("<html>Not Found</html>\n")  # what a web server may answer for a moved key
    result = _check_key(tmp_path, collections, page, keys["mirror"]["fingerprint"])
    assert result.returncode != 0
    message = _failure(result)
    assert "of no key (gpg:" in message and "no valid OpenPGP data found" in message, message


# --- model -> role variables --------------------------------------------------------------------------------------


def _cluster(source: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "name": "lab",
        "node_groups": {
            "gpu": {"hosts": "gpu01", "roles": ["slurm_compute"], "gpu": {"model": "H100-SXM5-80GB", "count": 8}},
            "ctl": {"hosts": "ctl01", "roles": ["slurm_controller", "monitoring"]},
        },
        "driver": {"version": "535.261.03", "source": source},
        "container_toolkit": {"source": source},
        "monitoring": {"dcgm_exporter": {"source": "package", "package_source": source}},
    }
    return resolve(Cluster.model_validate(data))


def _options(role: str) -> dict[str, Any]:
    return _yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "source",
    [
        {"type": "mirror", "url": "https://m.example/nv/", "keyring": "keys/m.asc", "fingerprint": "B" * 40},
        {"type": "mirror", "url": "http://m.example/nv/", "insecure": True},
        {"type": "local", "path": "/srv/debs"},
    ],
)
def test_fingerprint_and_insecure_reach_each_role(source: dict[str, Any]) -> None:
    rc = _cluster(source)
    rendered = {
        "nvidia_driver": driver.group_vars(rc),
        "nvidia_container_toolkit": toolkit.group_vars(rc),
        "dcgm_exporter": monitoring.group_vars(rc),
    }
    prefixes = {
        "nvidia_driver": "nvidia_driver_source",
        "nvidia_container_toolkit": "nvidia_container_toolkit_source",
        "dcgm_exporter": "dcgm_exporter_package_source",
    }
    for role, out in rendered.items():
        prefix = prefixes[role]
        options = _options(role)
        assert out[f"{prefix}_fingerprint"] == source.get("fingerprint", "")
        assert out[f"{prefix}_insecure"] is source.get("insecure", False)
        assert out[f"{prefix}_keyring"] == source.get("keyring", "")
        for name in ("fingerprint", "insecure"):
            assert options[f"{prefix}_{name}"]["type"] == {"fingerprint": "str", "insecure": "bool"}[name]
