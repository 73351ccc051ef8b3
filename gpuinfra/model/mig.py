"""Named MIG layouts, written inline or taken from an existing mig-parted v1 file."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .base import Model, PositiveInt

LayoutName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$")]


class Mig(Model):
    layouts: dict[LayoutName, Annotated[dict[str, PositiveInt], Field(min_length=1)]] = {}
    """Layout name -> {MIG profile: count} for one GPU, e.g. {3g.40gb: 2}."""
    parted_file: str | None = None
    """A mig-parted v1 file whose `mig-configs` become layouts (relative to the cluster file)."""
