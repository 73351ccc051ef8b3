"""Every plugin's DOCUMENTATION, EXAMPLES and RETURN are read as Ansible reads them (ansible-doc, ansible-lint's
argument checks): a block that does not parse leaves the plugin without documentation, and Ansible says so only
as a log line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.plugin_docs import read_docstring

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p for p in (ROOT / "plugins").glob("*/*.py") if "DOCUMENTATION" in p.read_text())


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_the_documentation_parses(path: Path) -> None:
    docs = read_docstring(str(path))
    assert isinstance(docs["doc"], dict) and docs["doc"].get("short_description"), "DOCUMENTATION does not parse"
    assert yaml.safe_load(docs["plainexamples"] or "") is not None or "EXAMPLES" not in path.read_text()
    assert docs["returndocs"] is None or isinstance(docs["returndocs"], dict)
