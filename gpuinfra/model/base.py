"""Shared building blocks of the cluster model.

Every model is strict: unknown keys are rejected and values are never coerced across types, so a YAML 1.1
word such as `no` or an unquoted `550.54` can never silently become a boolean or a float.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


NAME_PATTERN = r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$"
UNIX_NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h|d|w|y))+$"
SLURM_TIME_PATTERN = r"^(UNLIMITED|INFINITE|[0-9]+|[0-9]+:[0-9]{2}(:[0-9]{2})?|[0-9]+-[0-9]{1,2}(:[0-9]{2}){0,2})$"
DRIVER_VERSION_PATTERN = r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$"
PERCENT_PATTERN = r"^([1-9][0-9]?|100)%$"

# What a constrained string should look like, in words, for error messages.
PATTERN_HINTS = {
    NAME_PATTERN: "a name of lower-case letters, digits, '-' and '_' (at most 64)",
    UNIX_NAME_PATTERN: "a Unix user or group name",
    DURATION_PATTERN: "a duration such as 30s, 5m, 2h or 15d",
    SLURM_TIME_PATTERN: "a Slurm time such as 60, 12:00:00, 2-00:00:00 or UNLIMITED",
    DRIVER_VERSION_PATTERN: "an exact driver version such as '535.261.03'",
    PERCENT_PATTERN: "a percentage such as '25%'",
    r"^[0-9]+%?$": "a count or a percentage such as '25%'",
    r"^(https?|file)://": "an http://, https:// or file:// URL",
    r"^https?://": "an http:// or https:// URL",
}

# Names used as mapping keys (node groups, partitions, accounts, tenants, ...). Lower-case so that they are
# valid for Slurm, Kubernetes and Ansible group names alike.
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]

# A POSIX user or group name.
UnixName = Annotated[str, StringConstraints(pattern=UNIX_NAME_PATTERN)]

# A Prometheus/Go style duration: 30s, 2m, 1h30m, 15d, 2w.
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN)]

# A Slurm time limit: UNLIMITED, minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SlurmTime = Annotated[str, StringConstraints(pattern=SLURM_TIME_PATTERN)]

# An exact NVIDIA driver version such as 535.261.03 (some branches have two parts: 550.54).
DriverVersion = Annotated[str, StringConstraints(pattern=DRIVER_VERSION_PATTERN)]

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Percent = Annotated[int, Field(ge=0, le=100)]
