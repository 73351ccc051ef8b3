"""Shared building blocks of the cluster model.

Every model is strict: unknown keys are rejected and values are never coerced across types, so a YAML 1.1
word such as `no` or an unquoted `550.54` can never silently become a boolean or a float.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


# Names used as mapping keys (node groups, partitions, accounts, tenants, ...). Lower-case so that they are
# valid for Slurm, Kubernetes and Ansible group names alike.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$")]

# A POSIX user or group name.
UnixName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]

# A Prometheus/Go style duration: 30s, 2m, 1h30m, 15d, 2w.
Duration = Annotated[str, StringConstraints(pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$")]

# A Slurm time limit: UNLIMITED, minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SlurmTime = Annotated[
    str,
    StringConstraints(
        pattern=r"^(UNLIMITED|INFINITE|[0-9]+|[0-9]+:[0-9]{2}(:[0-9]{2})?|[0-9]+-[0-9]{1,2}(:[0-9]{2}){0,2})$"
    ),
]

# An exact NVIDIA driver version such as 535.261.03 (some branches have two parts: 550.54).
DriverVersion = Annotated[str, StringConstraints(pattern=r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")]

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Percent = Annotated[int, Field(ge=0, le=100)]
