"""Values as Ansible data: every string in Ansible's unsafe form, so that nothing a cluster file or a host gives is
ever templated. The inventory's values and every run's extra vars go through here."""

from __future__ import annotations

from typing import Any


def as_data(variables: dict[str, Any]) -> dict[str, Any]:
    """Variables as the inventory hands them to Ansible: every value unsafe, except Ansible's own connection
    settings (`ansible_host`, `ansible_user`, ...). Those come from fields whose grammar admits no template
    delimiter (addresses, Unix names, paths), and tools that read the inventory to connect (testinfra, AWX) take
    them only as plain strings."""
    return {key: value if key.startswith("ansible_") else unsafe(value) for key, value in variables.items()}


def unsafe(value: Any) -> Any:
    """`value` with every string (not mapping keys) in Ansible's unsafe form. Keys are never templated, and every
    key of the model is a name whose grammar admits no template delimiter."""
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    if isinstance(value, dict) and list(value) == ["__ansible_unsafe"] and isinstance(value["__ansible_unsafe"], str):
        return value  # already data: wrapped again, Ansible's decoder would hand the inner text on as a template
    if isinstance(value, list):
        return [unsafe(item) for item in value]
    if isinstance(value, dict):
        return {key: unsafe(item) for key, item in value.items()}
    return value
