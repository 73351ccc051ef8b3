"""What gpuinfra ships: the wheel carries the collection `apply` needs, and the collection tarball holds the
collection and nothing else, builds with ansible-core alone (no distlib), installs offline, and declares the
collections it calls.

The installed wheel is run for real against the sandbox in tests/sandbox/test_installed_wheel.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECTION_PARTS = ["galaxy.yml", "meta", "playbooks", "plugins", "roles"]
# Top-level entries a collection tarball may hold: the collection and its docs, and the two files ansible-galaxy writes
# (MANIFEST.json carries galaxy.yml's contents; ansible-galaxy leaves galaxy.yml itself out).
TARBALL_TOP = {"CHANGELOG.md", "README.md", "docs", "meta", "playbooks", "plugins", "roles"}
GALAXY_FILES = {"FILES.json", "MANIFEST.json"}
# Names that hold, or look like, key material: none may enter a tarball.
KEY_NAMES = re.compile(r"(id_(rsa|ecdsa|ed25519|dsa)|\.(pem|key|p12|pfx)$)")
# ansible-galaxy as a user of ansible-core alone runs it: ansible-core does not depend on distlib, so the build must
# not need it (galaxy.yml's `manifest` does). Blocked in sys.modules, `import distlib` fails as if it were absent.
GALAXY_WITHOUT_DISTLIB = """
import sys
sys.modules["distlib"] = None
try:
    import distlib
except ImportError:
    pass
else:
    sys.exit("distlib is importable")
from ansible.cli.galaxy import main
sys.argv[0] = "ansible-galaxy"
main()
"""


def _run(*command: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout


def _files(folder: Path) -> set[str]:
    return {
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(BIN / "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out, ROOT)
    (built,) = out.glob("gpuinfra-*.whl")
    return built


def build_collection(source: Path, out: Path) -> Path:
    _run(BIN / "python", "-c", GALAXY_WITHOUT_DISTLIB, "collection", "build", "--output-path", out, source)
    (built,) = out.glob("gpuinfra-cluster-*.tar.gz")
    return built


def tarball_names(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as archive:
        return archive.getnames()


def tarball_files(tarball: Path) -> set[str]:
    with tarfile.open(tarball) as archive:
        return {member.name for member in archive.getmembers() if member.isfile()}


def collection_files(source: Path) -> set[str]:
    """The files the collection is made of, by rule: all of meta/, playbooks/ and roles/, the plugins' Python and
    YAML, the Markdown docs, README.md and CHANGELOG.md; never a hidden file, compiled Python or a key."""
    kinds = {"meta": None, "playbooks": None, "roles": None, "plugins": {".py", ".yml"}, "docs": {".md"}}
    out = {name for name in ("README.md", "CHANGELOG.md") if (source / name).is_file()}
    for top, suffixes in kinds.items():
        for path in (source / top).rglob("*"):
            relative = path.relative_to(source)
            name = str(relative)
            if not path.is_file() or any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
                continue
            if path.suffix != ".pyc" and not KEY_NAMES.search(name) and (suffixes is None or path.suffix in suffixes):
                out.add(name)
    return out


def test_the_wheel_carries_the_whole_collection_and_no_tests(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packaged = {
        name.removeprefix("gpuinfra/_collection/") for name in names if name.startswith("gpuinfra/_collection/")
    }
    expected = set()
    for part in COLLECTION_PARTS:
        expected |= {part} if (ROOT / part).is_file() else {f"{part}/{name}" for name in _files(ROOT / part)}
    assert packaged == expected
    assert "gpuinfra/py.typed" in names and "gpuinfra/cli/__init__.py" in names
    assert not [name for name in names if name.startswith(("tests/", "molecule/", "benchmarks/", "scripts/"))]
    assert not [name for name in names if name.endswith(".pyc") or KEY_NAMES.search(name)]


def test_the_collection_tarball_holds_only_the_collection(tmp_path: Path) -> None:
    """Build from a copy of the checkout with everything a working tree may hold beside the collection: the Python
    project, tests, a sandbox's .ansible folder with a copied key, secrets, build output and stray keys."""
    source = tmp_path / "checkout"
    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".*cache", ".hypothesis", "dist", "build")
    shutil.copytree(ROOT, source, ignore=ignore, symlinks=True)
    planted = [
        ".ansible/tmp/id_ed25519",
        ".gpuinfra/schema.json",
        "secrets/hpc/munge.key",
        "build/lib/gpuinfra/__init__.py",
        "roles/munge/files/munge.key",
        "roles/munge/files/id_rsa",
        "playbooks/cert.pem",
        "docs/site.p12",
        "plugins/modules/.env",
    ]
    for name in planted:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text("secret\n")
    tarball = build_collection(source, tmp_path)
    names = tarball_names(tarball)

    # Exactly the collection's files: a new top-level entry of the checkout, say, is neither, and fails here until
    # galaxy.yml's build_ignore names it.
    assert tarball_files(tarball) - GALAXY_FILES == collection_files(source)
    assert {name.split("/")[0] for name in names} <= TARBALL_TOP | GALAXY_FILES
    assert not [name for name in names if KEY_NAMES.search(name)]
    assert not set(planted) & set(names)
    assert {"roles/nvidia_driver/tasks/main.yml", "playbooks/site.yml", "plugins/modules/gpu_health.py"} <= set(names)


def test_galaxy_declares_every_collection_the_roles_and_plugins_call() -> None:
    galaxy = YAML(typ="safe").load(ROOT / "galaxy.yml")
    task_module = re.compile(r"^\s*(?:- )?\s*([a-z_]+\.[a-z_]+)\.[a-z_0-9]+:", re.MULTILINE)
    python_import = re.compile(r"ansible_collections\.([a-z_]+\.[a-z_]+)\.")
    used = set()
    for folder in ("roles", "playbooks", "plugins"):
        for path in (ROOT / folder).rglob("*"):
            pattern = {".yml": task_module, ".py": python_import}.get(path.suffix)
            if pattern:
                used |= set(pattern.findall(path.read_text()))
    assert "kubernetes.core" in used  # the scan finds what it looks for
    assert used - {"ansible.builtin", "gpuinfra.cluster"} == set(galaxy["dependencies"])
    assert all(re.fullmatch(r">=\d+\.\d+\.\d+,<\d+\.\d+\.\d+", spec) for spec in galaxy["dependencies"].values())


def test_the_tarball_installs_offline_and_lists_its_roles_and_playbooks(tmp_path: Path) -> None:
    tarball = build_collection(ROOT, tmp_path)
    target = tmp_path / "collections"
    # Only the dependencies (bundled with the `ansible` package) beside the target: nothing is downloaded.
    bundled = next(entry for entry in sys.path if (Path(entry) / "ansible_collections" / "kubernetes").is_dir())
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": f"{target}{os.pathsep}{bundled}"}
    _run(BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", target, tarball, cwd=tmp_path, env=env)
    installed = target / "ansible_collections" / "gpuinfra" / "cluster"
    assert json.loads((installed / "MANIFEST.json").read_text())["collection_info"]["dependencies"]

    listed = json.loads(
        _run(BIN / "ansible-doc", "-t", "role", "-l", "gpuinfra.cluster", "--json", cwd=tmp_path, env=env)
    )
    roles = {path.name for path in (ROOT / "roles").iterdir() if path.is_dir()}
    assert set(listed) == {f"gpuinfra.cluster.{role}" for role in roles}

    # Each FQCN resolves to the installed copy, not to this checkout.
    stems = sorted(path.stem for path in (ROOT / "playbooks").glob("*.yml"))
    fqcns = [f"gpuinfra.cluster.{stem}" for stem in stems]
    checked = _run(BIN / "ansible-playbook", "--syntax-check", "-i", "localhost,", *fqcns, cwd=tmp_path, env=env)
    assert re.findall(r"^playbook: (.*)$", checked, re.MULTILINE) == [
        str(installed / "playbooks" / f"{stem}.yml") for stem in stems
    ]
