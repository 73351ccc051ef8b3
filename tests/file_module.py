"""Files of the repository that are not modules of the gpuinfra package (the collection's plugins, scripts, other
test files), loaded as modules for the tests, once per session."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MODULE_UTILS = "plugins/module_utils"
_RELATIVE_IMPORT = re.compile(r"^from \.(\w+) import", re.M)


def load(path: str, name: str | None = None) -> ModuleType:
    """The file at `path` (from the repository's root) as the module `name` (default: made from the path, so that
    two files of the same name are two modules)."""
    name = name or "under_test_" + path.removesuffix(".py").replace("/", "_").replace("-", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def collection_module(path: str) -> ModuleType:
    """A file of the collection under the name Ansible imports it by (ansible_collections.gpuinfra.cluster.<path>),
    so that the plugins that import it find this one."""
    return load(path, "ansible_collections.gpuinfra.cluster." + path.removesuffix(".py").replace("/", "."))


def module_util(name: str) -> ModuleType:
    """plugins/module_utils/NAME.py under the name Ansible imports it by, after the module_utils it imports (their
    relative imports find them loaded), as the gpu_health module and the health program import them."""
    for needed in _RELATIVE_IMPORT.findall((ROOT / MODULE_UTILS / f"{name}.py").read_text()):
        module_util(needed)
    return collection_module(f"{MODULE_UTILS}/{name}.py")


def node_program(folder: Path, program: str | Path, library: list[str], name: str | None = None) -> list[str]:
    """The command that runs a node program of the collection (`program`, from the repository's root) as its role
    installs it: the module_utils in `library` linked into FOLDER/lib/gpuinfra_node, which comes first on sys.path,
    and argv[0] its installed `name`. Arguments follow the command."""
    installed = folder / "lib" / "gpuinfra_node"
    installed.mkdir(parents=True, exist_ok=True)
    for file in library:
        if not (installed / file).exists():
            (installed / file).symlink_to(ROOT / MODULE_UTILS / file)
    starter = (
        "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); program = sys.argv.pop(1); "
        "sys.argv[0] = sys.argv.pop(1) or program; runpy.run_path(program, run_name='__main__')"
    )
    return [sys.executable, "-c", starter, str(folder / "lib"), str(ROOT / program), name or ""]
