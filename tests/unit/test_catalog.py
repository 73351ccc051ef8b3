"""The GPU catalog is consistent with itself, with MIG's slice geometry and with the facts in DESIGN.md section 7."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuinfra import catalog
from gpuinfra import mig_layouts as mig
from gpuinfra.catalog import GpuSpec

ROOT = Path(__file__).resolve().parents[2]
SPECS = catalog.specs()
MIG_SPECS = [s for s in SPECS if s.mig_capable]
ARCHITECTURES = ["volta", "turing", "ampere", "ada", "hopper", "blackwell"]
# The first driver branch that knew any part of each architecture (CUDA 9, 10, 11, and the first releases for
# Ada/Hopper data center parts and for Blackwell). No part may claim an older branch.
FIRST_BRANCH = {"volta": 384, "turing": 410, "ampere": 450, "ada": 520, "hopper": 520, "blackwell": 570}


def ids(specs: list[GpuSpec]) -> list[str]:
    return [s.name for s in specs]


def spec_of(name: str) -> GpuSpec:
    spec = catalog.lookup(name)
    assert spec is not None, name
    return spec


def test_names_are_unique_and_looked_up_exactly_and_in_any_case() -> None:
    names = catalog.names()
    assert len(names) == len(set(names))
    assert len({n.casefold() for n in names}) == len(names)
    for name in names:
        spec = catalog.lookup(name)
        assert spec is not None and spec.name == name
        assert catalog.lookup(name.lower()) is spec
    assert catalog.lookup("H100-SXM-80G") is None
    assert catalog.lookup("") is None


def test_the_catalog_covers_the_parts_the_issue_names() -> None:
    wanted = [
        "V100-SXM2-16GB",
        "V100-SXM2-32GB",
        "V100-PCIE-16GB",
        "T4",
        "A10",
        "A30",
        "A40",
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "A100-PCIE-40GB",
        "A100-PCIE-80GB",
        "L4",
        "L40",
        "L40S",
        "H100-SXM5-80GB",
        "H100-PCIE-80GB",
        "H100-NVL",
        "H200-SXM5-141GB",
        "H200-NVL",
        "GH200-96GB",
        "GH200-144GB",
        "B200",
        "GB200",
        "H20",
    ]
    assert [n for n in wanted if catalog.lookup(n) is None] == []


def test_every_model_the_example_inventories_use_is_catalogued() -> None:
    used = set()
    for path in sorted(ROOT.glob("inventories/*/*.yml")):
        used.update(re.findall(r"model:\s*([A-Za-z0-9._-]+)", path.read_text()))
    assert used, "the example inventories name no GPU models"
    assert sorted(m for m in used if catalog.lookup(m) is None) == []


def test_pci_ids_are_well_formed_and_unique_across_the_catalog() -> None:
    seen: dict[str, str] = {}
    for spec in SPECS:
        assert spec.pci_ids, spec.name
        for pci in spec.pci_ids:
            assert re.fullmatch(r"0x[0-9A-F]{4}", pci), (spec.name, pci)
            assert pci not in seen, f"{pci} is both {seen[pci]} and {spec.name}"
            seen[pci] = spec.name
        assert all(re.fullmatch(r"0x[0-9A-F]{4}10DE", p) for p in spec.parted_ids)
        assert [catalog.by_pci_id(p) for p in spec.parted_ids] == [spec] * len(spec.pci_ids)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0x233010DE", "H100-SXM5-80GB"),
        ("0x233010de", "H100-SXM5-80GB"),
        ("0x2330", "H100-SXM5-80GB"),
        ("2330", "H100-SXM5-80GB"),
        (" 0x20B210DE ", "A100-SXM4-80GB"),
        ("0x20B710DE", "A30"),
        ("0x290110DE", "B200"),
        ("0x23301002", None),  # the same device number under another vendor
        ("0x9999", None),
        ("0x233", None),
        ("H100", None),
        ("", None),
    ],
)
def test_by_pci_id_reads_mig_parted_and_short_forms(given: str, expected: str | None) -> None:
    spec = catalog.by_pci_id(given)
    assert (spec.name if spec else None) == expected


def test_design_pci_ids_name_the_models_design_gives() -> None:
    """DESIGN.md section 7 lists PCI IDs per part; each names a model with that part's MIG table."""
    a100_40 = set(spec_of("A100-SXM4-40GB").mig_profiles)
    a100_80 = set(spec_of("A100-SXM4-80GB").mig_profiles)
    h200 = set(spec_of("H200-SXM5-141GB").mig_profiles)
    groups = {
        ("0x20B0", "0x20B1", "0x20F1", "0x20F6"): a100_40,
        ("0x20B2", "0x20B5", "0x20F3", "0x20F5"): a100_80,
        ("0x2330", "0x2331", "0x2322", "0x2324"): a100_80,
        ("0x2335", "0x233B"): h200,
    }
    for pci_ids, profiles in groups.items():
        for pci in pci_ids:
            spec = catalog.by_pci_id(pci)
            assert spec is not None, pci
            assert set(spec.mig_profiles) == profiles, (pci, spec.name)


@pytest.mark.parametrize(
    ("model", "table"),
    [
        (
            "A100-SXM4-40GB",
            {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
        ),
        (
            "A100-SXM4-80GB",
            {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
        ),
        (
            "H100-SXM5-80GB",
            {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
        ),
        (
            "H200-SXM5-141GB",
            {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
        ),
        ("A30", {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1}),
    ],
)
def test_mig_tables_match_design_and_nvidia(model: str, table: dict[str, int]) -> None:
    spec = catalog.lookup(model)
    assert spec is not None
    assert {name: p.max_count for name, p in spec.mig_profiles.items()} == table


def test_design_start_slots_for_an_eight_slice_part() -> None:
    profiles = spec_of("A100-SXM4-80GB").mig_profiles
    slots = {name: (p.start_slots, p.memory_slices) for name, p in profiles.items()}
    assert slots == {
        "7g.80gb": ((0,), 8),
        "4g.40gb": ((0,), 4),
        "3g.40gb": ((0, 4), 4),
        "2g.20gb": ((0, 2, 4), 2),
        "1g.10gb": ((0, 1, 2, 3, 4, 5, 6), 1),
        "1g.10gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
        "1g.20gb": ((0, 2, 4, 6), 2),
    }


@pytest.mark.parametrize("spec", MIG_SPECS, ids=ids(MIG_SPECS))
def test_every_mig_profile_fits_its_gpu(spec: GpuSpec) -> None:
    assert (spec.mig_compute_slices, spec.mig_memory_slices) in {(7, 8), (4, 4)}
    for name, p in spec.mig_profiles.items():
        assert p.name == name
        assert mig.PROFILE_NAME.fullmatch(name), name
        assert name.startswith(f"{p.compute_slices}g."), name
        assert name.split(".")[1].startswith(f"{p.memory_gb}gb"), name
        assert 1 <= p.compute_slices <= min(p.memory_slices, spec.mig_compute_slices), name
        assert 1 <= p.memory_slices <= spec.mig_memory_slices, name
        # Profile memory is the profile's share of the card, rounded: never more than the card has.
        assert p.memory_gb <= spec.memory_gb, name
        share = spec.memory_gb * p.memory_slices / spec.mig_memory_slices
        assert abs(p.memory_gb - share) <= 1, (name, share)
        assert list(p.start_slots) == sorted(set(p.start_slots)), name
        for start in p.start_slots:
            assert start % p.memory_slices == 0 or p.memory_slices == 1, (name, start)
            assert start >= 0 and start + p.memory_slices <= spec.mig_memory_slices, (name, start)
            # A compute slice sits with every start slot: no instance starts on the last, compute-less slot.
            assert start < spec.mig_compute_slices, (name, start)


@pytest.mark.parametrize("spec", MIG_SPECS, ids=ids(MIG_SPECS))
def test_max_counts_follow_from_the_geometry(spec: GpuSpec) -> None:
    """A profile's maximum is what fits of it alone on an empty GPU: its start slots, or one for media profiles."""
    for name, p in spec.mig_profiles.items():
        fits = max(n for n in range(1, 9) if mig.place(spec, {name: n}) is not None)
        assert p.max_count == fits, name
        assert p.max_count == (1 if p.media_extensions else len(p.start_slots)), name
        if p.compute_slices == 1 and p.memory_slices == 1 and not p.media_extensions:
            assert p.max_count == spec.mig_compute_slices, name


@pytest.mark.parametrize("spec", MIG_SPECS, ids=ids(MIG_SPECS))
def test_every_mig_part_has_one_media_profile_on_its_smallest_slice(spec: GpuSpec) -> None:
    media = [p for p in spec.mig_profiles.values() if p.media_extensions and p.name.endswith("+me")]
    assert media and min(p.compute_slices for p in media) == 1, spec.name
    assert all(p.max_count == 1 for p in media)


def test_variants_exist_only_where_nvidia_lists_them() -> None:
    with_all = {s.name for s in MIG_SPECS if any(n.endswith("+me.all") for n in s.mig_profiles)}
    with_gfx = {s.name for s in MIG_SPECS if any(n.endswith("+gfx") for n in s.mig_profiles)}
    assert with_all == with_gfx == {"RTX-PRO-6000-Blackwell-Server"}


@pytest.mark.parametrize("spec", SPECS, ids=ids(SPECS))
def test_driver_and_module_facts_are_sane(spec: GpuSpec) -> None:
    assert spec.architecture in ARCHITECTURES
    assert FIRST_BRANCH[spec.architecture] <= spec.min_driver_branch <= 600
    assert spec.supports_open_modules == (ARCHITECTURES.index(spec.architecture) >= ARCHITECTURES.index("turing"))
    assert spec.requires_open_modules == (spec.architecture == "blackwell")
    assert not spec.requires_open_modules or spec.supports_open_modules
    assert re.fullmatch(r"[a-z0-9_]+", spec.slurm_type)
    assert 8 <= spec.memory_gb <= 300
    if spec.mig_capable:
        assert ARCHITECTURES.index(spec.architecture) >= ARCHITECTURES.index("ampere")
    else:
        assert (spec.mig_compute_slices, spec.mig_memory_slices) == (0, 0)


def test_design_driver_minimums() -> None:
    names = ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM5-141GB", "B200")
    branches = {name: spec_of(name).min_driver_branch for name in names}
    assert branches == {"A100-SXM4-80GB": 450, "H100-SXM5-80GB": 525, "H200-SXM5-141GB": 550, "B200": 570}


def test_catalog_data_cannot_be_changed_by_a_caller() -> None:
    spec = catalog.lookup("A100-SXM4-80GB")
    assert spec is not None
    with pytest.raises(TypeError):
        spec.mig_profiles["9g.1gb"] = spec.mig_profiles["1g.10gb"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.memory_gb = 1  # type: ignore[misc]


# --- operating systems -------------------------------------------------------------------------------------------


def test_every_debian_release_of_the_model_has_archive_facts() -> None:
    from typing import get_args

    from gpuinfra.model.nodes import OperatingSystem

    debian = [name for name in get_args(OperatingSystem) if name.startswith("debian")]
    assert debian == ["debian12", "debian13"]
    assert [r.name for r in catalog.os_releases()] == debian


@pytest.mark.parametrize(
    ("name", "codename", "branch", "slurm", "kernel"),
    [("debian12", "bookworm", 535, "22.05", "6.1"), ("debian13", "trixie", 550, "24.11", "6.12")],
)
def test_debian_archive_facts(name: str, codename: str, branch: int, slurm: str, kernel: str) -> None:
    release = catalog.os_release(name)
    assert release is not None
    assert (release.codename, release.driver.branch, release.slurm_release, release.kernel) == (
        codename,
        branch,
        slurm,
        kernel,
    )
    assert release.driver.version.startswith(f"{branch}.")
    assert release.backports_driver is not None and release.backports_driver.branch == branch
    assert catalog.os_release("ubuntu22.04") is None


@pytest.mark.parametrize(
    ("newer", "older", "compatible"),
    [
        ("22.05", "22.05", True),
        ("22.05", "21.08", True),
        ("22.05", "20.11", True),  # two releases back
        ("24.05", "22.05", False),  # three back, before the wider window of 24.11
        ("24.11", "23.02", True),  # three back from 24.11 on
        ("24.11", "22.05", False),  # Debian 13's slurmctld and Debian 12's slurmd
        ("22.05", "24.11", False),  # an older controller never takes a newer slurmd
    ],
)
def test_slurm_compatibility_window(newer: str, older: str, compatible: bool) -> None:
    assert catalog.slurm_compatible(newer, older) is compatible


RECORDED = Path(__file__).resolve().parent / "data" / "nvidia-smi" / "h100-recorded"


def test_the_h100_mig_table_is_the_one_a_real_h100_reports() -> None:
    """Profile names, instance counts, start slots and sizes, from `nvidia-smi mig -lgip` and `-lgipp` recorded
    on a real H100 80GB HBM3 (tests/unit/data/nvidia-smi/README.md)."""
    profiles = {  # profile ID -> (name, instances)
        int(found["id"]): (found["name"], int(found["total"]))
        for found in re.finditer(
            r"^\|\s+\d+\s+MIG (?P<name>\S+)\s+(?P<id>\d+)\s+\d+/(?P<total>\d+)\s",
            (RECORDED / "nvidia-smi-lgip.txt").read_text(),
            re.M,
        )
    }
    placements = {  # profile ID -> (start slots, size)
        int(found["id"]): (tuple(int(slot) for slot in found["slots"].split(",")), int(found["size"]))
        for found in re.finditer(
            r"Profile ID\s+(?P<id>\d+) Placements?\s*:\s*\{(?P<slots>[\d,]+)\}:(?P<size>\d+)",
            (RECORDED / "nvidia-smi-lgipp.txt").read_text(),
        )
    }
    assert len(profiles) == len(placements) == 7
    recorded = {name: (count, *placements[pid]) for pid, (name, count) in profiles.items()}
    spec = catalog.lookup("H100-SXM5-80GB")
    assert spec is not None and "0x2330" in spec.pci_ids
    catalogued = {p.name: (p.max_count, p.start_slots, p.memory_slices) for p in spec.mig_profiles.values()}
    assert catalogued == recorded
