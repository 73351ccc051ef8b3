"""The base of every cluster model.

Every model is strict: unknown keys are rejected and values are never coerced across types, so a YAML 1.1
word such as `no` or an unquoted `550.54` can never silently become a boolean or a float. Field types come from
gpuinfra.model.grammar, which gives each the grammar of the place its value lands in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)
