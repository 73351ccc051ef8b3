"""The enroot and pyxis release sources for a test that moves HOME: the committed cluster files name them under
`~/.cache/gpuinfra/sources` (scripts/get-container-sources puts them there), which validation checks."""

from __future__ import annotations

from pathlib import Path

# Read when the tests are collected, before any test moves HOME.
SOURCES = Path.home() / ".cache" / "gpuinfra" / "sources"


def link_into(home: Path) -> None:
    """Make the sources appear under another home folder."""
    (home / ".cache" / "gpuinfra").mkdir(parents=True, exist_ok=True)
    (home / ".cache" / "gpuinfra" / "sources").symlink_to(SOURCES)
