"""MIG layouts: do these instances fit on one GPU, and mig-parted v1 files in and out.

A layout is {profile: count} for one GPU. It fits when every instance can be given one of its profile's start slots
without two instances sharing a memory slot (`place` searches for such a placement), the compute slices add up, no
two instances are of sizes NVIDIA never combines, and at most one instance carries the media extensions. Summing
slices is not enough: 3g.40gb + 3g.40gb + 1g.10gb needs 7 compute slices, which an 80 GB part has, but 9 of its 8
memory slices.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Any, Literal

from . import catalog
from .catalog import GpuSpec, MigProfile

Severity = Literal["error", "warning"]
Path = tuple[str | int, ...]

# Profile names as NVIDIA writes them: an optional compute-instance prefix ("1c."), "<g>g.<n>gb", then the
# attributes "+me" (media extensions), "+me.all" (all of them), "-me" (none) or "+gfx" (graphics).
PROFILE_NAME = re.compile(r"^(?:[1-7]c\.)?[1-8]g\.[1-9][0-9]*gb(?:\+me\.all|\+me|-me|\+gfx)*$")
PARTED_PCI_ID = re.compile(r"^0x[0-9A-Fa-f]{8}$")


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    severity: Severity = "error"


# --- one GPU ----------------------------------------------------------------------------------------------------


def check_layout(spec: GpuSpec, layout: Mapping[str, int]) -> list[str]:
    """Every problem of this layout on one GPU of that model; [] when it fits."""
    return [message for _profile, message in _layout_problems(spec, layout)]


def place(spec: GpuSpec, layout: Mapping[str, int]) -> list[tuple[str, int]] | None:
    """One valid placement, as (profile, start slot) per instance in slot order; None if there is none (or the
    layout names profiles the model does not have)."""
    if any(name not in spec.mig_profiles or count < 0 for name, count in layout.items()):
        return None
    return _search(spec, _key(layout))


def _key(layout: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, count) for name, count in layout.items() if count))


def _layout_problems(spec: GpuSpec, layout: Mapping[str, int]) -> list[tuple[str | None, str]]:
    """(profile or None, message) for every problem: per-profile ones first, then whether the whole packs.

    Memoised per (model, layout): a 10,000-node file repeats a handful of layouts on a handful of models."""
    items = tuple(layout.items())
    if catalog.lookup(spec.name) is spec and all(type(count) is int for _name, count in items):
        return list(_problems_cached(spec.name, items))
    return _find_problems(spec, layout)


@lru_cache(maxsize=4096)
def _problems_cached(spec_name: str, items: tuple[tuple[str, int], ...]) -> tuple[tuple[str | None, str], ...]:
    spec = catalog.lookup(spec_name)
    assert spec is not None
    return tuple(_find_problems(spec, dict(items)))


def _find_problems(spec: GpuSpec, layout: Mapping[str, int]) -> list[tuple[str | None, str]]:
    if not spec.mig_profiles:
        return [(None, f"{spec.name} does not support MIG")]
    out: list[tuple[str | None, str]] = []
    for name, count in layout.items():
        profile = spec.mig_profiles.get(name)
        if profile is None:
            valid = ", ".join(spec.mig_profiles)
            out.append((name, f"{name!r} is not a MIG profile of {spec.name} (valid: {valid})"))
        elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
            out.append((name, f"the count of {name} must be a whole number of at least 1, not {count!r}"))
        elif count > profile.max_count:
            why = (
                " (an instance with media extensions takes the GPU's only set of them)"
                if profile.media_extensions
                else ""
            )
            out.append((name, f"{count} x {name} is more than {spec.name} holds: at most {profile.max_count}{why}"))
    if out:
        return out
    media = [name for name in layout if spec.mig_profiles[name].media_extensions]
    if len(media) > 1:
        both = " and ".join(media)
        return [(None, f"{both} both carry media extensions; {spec.name} has one set, so one instance at most")]
    if _search(spec, _key(layout)) is None:
        return [(None, _why_not(spec, layout))]
    return []


def describe(layout: Mapping[str, int]) -> str:
    """{"3g.40gb": 2, "1g.10gb": 1} -> "2 x 3g.40gb + 1g.10gb"."""
    return " + ".join(name if count == 1 else f"{count} x {name}" for name, count in layout.items())


def _why_not(spec: GpuSpec, layout: Mapping[str, int]) -> str:
    profiles = {name: spec.mig_profiles[name] for name in layout}
    compute = sum(profiles[name].compute_slices * count for name, count in layout.items())
    memory = sum(profiles[name].memory_slices * count for name, count in layout.items())
    head = f"{describe(layout)} does not fit on {spec.name}"
    if compute > spec.mig_compute_slices:
        return f"{head}: it needs {compute} compute slices and the GPU has {spec.mig_compute_slices}"
    if memory > spec.mig_memory_slices:
        takes = ", ".join(f"{name} takes {p.memory_slices}" for name, p in profiles.items())
        return (
            f"{head}: it needs {memory} memory slices and the GPU has {spec.mig_memory_slices} ({takes}), "
            f"although its {compute} compute slices would fit"
        )
    by_size = {p.compute_slices: name for name, p in profiles.items()}
    for pair in spec.mig_exclusive_sizes:
        if pair <= by_size.keys():
            a, b = (by_size[size] for size in sorted(pair, reverse=True))
            return f"{head}: NVIDIA supports no combination of a {a} and a {b} instance on one GPU"
    slots = "; ".join(f"{name} at {_slots(p.start_slots)}" for name, p in profiles.items())
    return f"{head}: every arrangement overlaps; instances may only start at these memory slots: {slots}"


def _slots(starts: tuple[int, ...]) -> str:
    return str(starts[0]) if len(starts) == 1 else ", ".join(map(str, starts[:-1])) + f" or {starts[-1]}"


@lru_cache(maxsize=4096)
def _search_cached(spec_name: str, key: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...] | None:
    spec = catalog.lookup(spec_name)
    assert spec is not None
    return _pack(spec, key)


def _search(spec: GpuSpec, key: tuple[tuple[str, int], ...]) -> list[tuple[str, int]] | None:
    """Memoised per (model, layout), like the problems."""
    found = _search_cached(spec.name, key) if catalog.lookup(spec.name) is spec else _pack(spec, key)
    return None if found is None else list(found)


def _pack(spec: GpuSpec, key: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...] | None:
    profiles = [(spec.mig_profiles[name], count) for name, count in key]
    compute = sum(p.compute_slices * n for p, n in profiles)
    memory = sum(p.memory_slices * n for p, n in profiles)
    sizes = {p.compute_slices for p, _n in profiles}
    if (
        compute > spec.mig_compute_slices
        or memory > spec.mig_memory_slices
        or sum(n for p, n in profiles if p.media_extensions) > 1
        or any(pair <= sizes for pair in spec.mig_exclusive_sizes)
    ):
        return None
    # Largest first: big instances have the fewest start slots, so dead ends show early.
    profiles.sort(key=lambda item: (-item[0].memory_slices, len(item[0].start_slots)))
    placed = _place_from(profiles, 0, 0)
    return None if placed is None else tuple(sorted(placed, key=lambda item: (item[1], item[0])))


def _place_from(profiles: list[tuple[MigProfile, int]], index: int, used: int) -> list[tuple[str, int]] | None:
    """Backtracking over each profile's start slots. `used` is a bit mask of taken memory slots; instances of one
    profile take their slots in increasing order, so no arrangement is tried twice."""
    if index == len(profiles):
        return []
    profile, count = profiles[index]
    width = (1 << profile.memory_slices) - 1
    free = [start for start in profile.start_slots if not used & (width << start)]
    for starts in combinations(free, count):
        mask = 0
        for start in starts:
            slot = width << start
            if mask & slot:
                break
            mask |= slot
        else:
            rest = _place_from(profiles, index + 1, used | mask)
            if rest is not None:
                return [(profile.name, start) for start in starts] + rest
    return None


# --- mig-parted v1 files ----------------------------------------------------------------------------------------

_TOP_KEYS = ("version", "mig-configs")
_ENTRY_KEYS = ("devices", "mig-enabled", "device-filter", "mig-devices")


def parse_parted(data: object) -> tuple[dict[str, list[dict[str, Any]]], list[Problem]]:
    """A mig-parted v1 document (plain data) -> its `mig-configs` and every problem found, all at once.

    Entries with a `device-filter` are checked against every catalogued model their PCI IDs name; an ID the
    catalog lacks is a warning. Entries without a filter are checked for form only.
    """
    problems: list[Problem] = []
    if not isinstance(data, dict):
        return {}, [Problem((), "a mig-parted file is a mapping with `version: v1` and `mig-configs`")]
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(Problem((str(key),), _unknown_key(key, _TOP_KEYS)))
    version = data.get("version")
    if "version" not in data:
        problems.append(Problem((), "`version` is missing; add `version: v1`"))
    elif version != "v1":
        problems.append(Problem(("version",), f"version {version!r} is not supported; gpuinfra reads mig-parted v1"))
    raw_configs = data.get("mig-configs")
    if "mig-configs" not in data:
        problems.append(Problem((), "`mig-configs` is missing; add `mig-configs: {NAME: [...]}`"))
        return {}, problems
    if not isinstance(raw_configs, dict) or not raw_configs:
        problems.append(Problem(("mig-configs",), "`mig-configs` is a mapping of config name -> list of entries"))
        return {}, problems
    configs: dict[str, list[dict[str, Any]]] = {}
    for name, entries in raw_configs.items():
        loc: Path = ("mig-configs", str(name))
        if not isinstance(entries, list) or not entries:
            problems.append(Problem(loc, "a config is a non-empty list of entries (`- devices: all ...`)"))
            continue
        good = []
        for index, entry in enumerate(entries):
            entry_problems = _entry(entry, (*loc, index))
            problems.extend(entry_problems)
            if not any(p.severity == "error" for p in entry_problems):
                good.append(entry)
        configs[str(name)] = good
    return configs, problems


def _entry(entry: object, loc: Path) -> list[Problem]:
    if not isinstance(entry, dict):
        return [
            Problem(
                loc,
                "an entry is a mapping with `devices`, `mig-enabled` and optionally `device-filter` and `mig-devices`",
            )
        ]
    out: list[Problem] = []
    for key in entry:
        if key not in _ENTRY_KEYS:
            out.append(Problem((*loc, str(key)), _unknown_key(key, _ENTRY_KEYS)))
    for key in ("devices", "mig-enabled"):
        if key not in entry:
            out.append(Problem(loc, f"`{key}` is missing"))
    devices = entry.get("devices", "all")
    if devices != "all" and not (
        isinstance(devices, list)
        and devices
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    ):
        out.append(Problem((*loc, "devices"), "`devices` is `all` or a list of GPU indices such as [0, 1]"))
    enabled = entry.get("mig-enabled", False)
    if not isinstance(enabled, bool):
        out.append(Problem((*loc, "mig-enabled"), f"`mig-enabled` is true or false, not {enabled!r}"))
    pci_ids = _filter(entry.get("device-filter"), (*loc, "device-filter"), out) if "device-filter" in entry else []
    layout = _devices(entry.get("mig-devices", {}), (*loc, "mig-devices"), out)
    if layout and enabled is False:
        out.append(Problem((*loc, "mig-devices"), "`mig-devices` needs `mig-enabled: true`"))
    if out or not layout:
        return out
    for pci_id in pci_ids:
        spec = catalog.by_pci_id(pci_id)
        if not pci_id.upper().endswith(catalog.NVIDIA_VENDOR):
            message = f"PCI ID {pci_id} names vendor {pci_id[-4:]}, not NVIDIA; its layout is not checked"
            out.append(Problem((*loc, "device-filter"), message, "warning"))
            continue
        if spec is None:
            out.append(
                Problem(
                    (*loc, "device-filter"),
                    f"PCI device {pci_id} is not in the GPU catalog; its layout is not checked",
                    "warning",
                )
            )
            continue
        for profile, message in _layout_problems(spec, layout):
            where = (*loc, "mig-devices", profile) if profile is not None else (*loc, "mig-devices")
            out.append(Problem(where, message if spec.name in message else f"on {spec.name}: {message}"))
    return _unique(out)


def _filter(value: object, loc: Path, out: list[Problem]) -> list[str]:
    ids = [value] if isinstance(value, str) else value
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        out.append(Problem(loc, '`device-filter` is a PCI ID such as "0x233010DE" or a list of them'))
        return []
    bad = [i for i in ids if not PARTED_PCI_ID.match(i)]
    for pci_id in bad:
        out.append(
            Problem(
                loc, f'{pci_id!r} is not a PCI ID as mig-parted writes them (device then vendor, e.g. "0x233010DE")'
            )
        )
    return [] if bad else list(ids)


def _devices(value: object, loc: Path, out: list[Problem]) -> dict[str, int]:
    if not isinstance(value, dict):
        out.append(Problem(loc, '`mig-devices` is a mapping of MIG profile -> count, such as {"1g.10gb": 7}'))
        return {}
    layout: dict[str, int] = {}
    for profile, count in value.items():
        where = (*loc, str(profile))
        if not isinstance(profile, str) or not PROFILE_NAME.match(profile):
            out.append(
                Problem(where, f"{profile!r} is not a MIG profile name (such as 1g.10gb, 3g.40gb or 1g.10gb+me)")
            )
        elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
            out.append(Problem(where, f"the count of {profile} must be a whole number of at least 1, not {count!r}"))
        else:
            layout[profile] = count
    return layout if len(layout) == len(value) else {}


def _unknown_key(key: object, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown key {key!r}; {hint}"


def _unique(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


def uniform_layouts(configs: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """The configs usable as cluster layouts, name -> {profile: count}: those whose MIG-enabled entries all cover
    `devices: all` with one and the same `mig-devices` (a config may repeat it per device filter)."""
    out: dict[str, dict[str, int]] = {}
    for name, entries in configs.items():
        enabled = [e for e in entries if e.get("mig-enabled") is True]
        if not enabled or any(e.get("devices") != "all" for e in enabled):
            continue
        layouts = [dict(e.get("mig-devices") or {}) for e in enabled]
        if layouts[0] and all(layout == layouts[0] for layout in layouts):
            out[name] = layouts[0]
    return out


class UnknownGpuModel(ValueError):
    """A model name that is not in the GPU catalog."""


def render_parted(layouts: Mapping[str, Mapping[str, int]], models: list[str]) -> dict[str, Any]:
    """A mig-parted v1 document: per layout, one entry per GPU model, filtered to that model's PCI IDs."""
    specs = []
    for model in models:
        spec = catalog.lookup(model)
        if spec is None:
            raise UnknownGpuModel(f"{model!r} is not in the GPU catalog")
        specs.append(spec)
    configs = {
        name: [
            {"devices": "all", "mig-enabled": True, "device-filter": list(spec.parted_ids), "mig-devices": dict(layout)}
            for spec in specs
        ]
        for name, layout in layouts.items()
    }
    return {"version": "v1", "mig-configs": configs}
