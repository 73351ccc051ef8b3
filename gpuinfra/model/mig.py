"""Named MIG layouts, written inline or taken from an existing mig-parted v1 file."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import Model
from .grammar import ControllerPath, LayoutName, MigProfileName, PositiveInt


class Mig(Model):
    layouts: dict[LayoutName, Annotated[dict[MigProfileName, PositiveInt], Field(min_length=1, max_length=16)]] = {}
    """Layout name -> {MIG profile: count} for one GPU, e.g. {3g.40gb: 2}."""
    parted_file: ControllerPath | None = None
    """A mig-parted v1 file whose `mig-configs` become layouts (relative to the cluster file)."""
