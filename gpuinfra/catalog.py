"""The GPU catalog: the datacenter parts gpuinfra knows, their PCI IDs, driver needs and MIG profile tables.

The catalog is data. Every model is one row of `_MODELS` below and every MIG profile table is derived from one of
two slice geometries NVIDIA's MIG user guide describes, so that the start slots and maximum counts cannot drift
between models that share a geometry:

- "7x8": 7 compute slices over 8 memory slices (A100, H100, H200, H20, GH200, B200, GB200);
- "4x4": 4 compute slices over 4 memory slices (A30, RTX PRO 6000 Blackwell Server Edition).

Sources: NVIDIA's MIG user guide (profile tables, placements), NVIDIA's mig-parted default configuration and the
`nvidia-smi mig -lgip` listings in its pull requests (profile names per PCI device ID), the PCI ID repository
(device IDs), and NVIDIA's driver release notes (first driver branch per part). Where a fact could not be confirmed
the profile or model is left out, and a comment says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Literal

from .collection import module_util

Architecture = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell"]

NVIDIA_VENDOR = "10DE"


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile as NVIDIA names it, e.g. "3g.40gb" or "1g.10gb+me"."""

    name: str
    compute_slices: int
    memory_slices: int
    """The instance's size in memory slices: how many slots it occupies from its start slot."""
    memory_gb: int
    max_count: int
    """How many instances of this profile one GPU holds at most."""
    start_slots: tuple[int, ...]
    """The memory slots an instance may start at (`nvidia-smi mig -lgipp` placements)."""
    media_extensions: bool = False
    """`+me` / `+me.all`: the instance takes the GPU's media engines, so at most one such instance per GPU."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    architecture: Architecture
    memory_gb: int
    pci_ids: tuple[str, ...]
    """PCI device IDs, "0x" and four upper-case hex digits (vendor 10DE implied), e.g. "0x2330"."""
    min_driver_branch: int
    supports_open_modules: bool
    requires_open_modules: bool
    slurm_type: str
    """The Slurm GRES type of a whole GPU of this model (`Name=gpu Type=...`)."""
    nvswitch_board: bool
    """Made for boards whose GPUs meet at NVSwitch chips (HGX/DGX and Grace systems), which need the fabric manager;
    a PCIe card has at most an NVLink bridge to one other card, and no NVSwitch."""
    mig_profiles: MappingProxyType[str, MigProfile] = field(default_factory=lambda: MappingProxyType({}))
    mig_compute_slices: int = 0
    mig_memory_slices: int = 0
    mig_exclusive_sizes: frozenset[frozenset[int]] = frozenset()
    """Pairs of compute sizes (e.g. {4, 3}) that never share a GPU although their slots would allow it."""

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def parted_ids(self) -> tuple[str, ...]:
        """The PCI IDs as mig-parted's `device-filter` writes them: device then vendor, "0x233010DE"."""
        return tuple(f"0x{pci[2:]}{NVIDIA_VENDOR}" for pci in self.pci_ids)


# --- MIG geometries ---------------------------------------------------------------------------------------------
# shape -> (compute slices, memory slices, start slots). The maximum count of a shape is the number of its start
# slots: no two of its own placements overlap. Shapes:
#   1g    one compute slice with one memory slice (1g.10gb on an 80 GB part)
#   1g2   one compute slice with two memory slices (1g.20gb on an 80 GB part, the "double memory" 1g)
#   2g, 3g, 4g, 7g as named; a 3g takes four memory slices and a 7g all eight.
_Shape = tuple[int, int, tuple[int, ...]]
# fmt: off
_GEOMETRIES: dict[str, tuple[int, int, dict[str, _Shape]]] = {
    "7x8": (7, 8, {
        "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g2": (1, 2, (0, 2, 4, 6)),
        "2g": (2, 2, (0, 2, 4)),
        "3g": (3, 4, (0, 4)),
        "4g": (4, 4, (0,)),
        "7g": (7, 8, (0,)),
    }),
    "4x4": (4, 4, {
        "1g": (1, 1, (0, 1, 2, 3)),
        "2g": (2, 2, (0, 2)),
        "4g": (4, 4, (0,)),
    }),
}
# fmt: on
# NVIDIA's supported-combination tables for the 7x8 parts never pair a 4g with a 3g instance, and the driver refuses
# the pair ("Insufficient Resources", NVIDIA/mig-parted#29), although 4g at slot 0 and 3g at slot 4 do not overlap.
_EXCLUSIVE: dict[str, frozenset[frozenset[int]]] = {"7x8": frozenset({frozenset({4, 3})}), "4x4": frozenset()}

_GB = re.compile(r"\.(\d+)gb")


@dataclass(frozen=True)
class _Mig:
    """A part's MIG columns: its geometry, its profile name per shape, and its variant profiles (name -> the shape
    it has). A variant with `+me` or `+me.all` takes the media engines; `-me` (none) and `+gfx` (graphics) do not."""

    geometry: str
    shapes: dict[str, str]
    variants: tuple[str, ...] = ()


def _mig_table(mig: _Mig) -> MappingProxyType[str, MigProfile]:
    table = _GEOMETRIES[mig.geometry][2]
    out: dict[str, MigProfile] = {}
    for shape, name in mig.shapes.items():
        compute, memory, starts = table[shape]
        out[name] = MigProfile(name, compute, memory, _memory_gb(name), len(starts), starts)
    base = {name: shape for shape, name in mig.shapes.items()}
    for name in mig.variants:
        compute, memory, starts = table[base[_VARIANT.sub("", name)]]
        media = name.endswith(("+me", "+me.all"))
        out[name] = MigProfile(name, compute, memory, _memory_gb(name), 1 if media else len(starts), starts, media)
    return MappingProxyType(dict(sorted(out.items(), key=lambda item: _order(item[1]))))


_GB = re.compile(r"\.(\d+)gb")
_VARIANT = re.compile(r"(\+me\.all|\+me|-me|\+gfx)$")


def _memory_gb(profile: str) -> int:
    match = _GB.search(profile)
    assert match, profile
    return int(match.group(1))


def _order(profile: MigProfile) -> tuple[int, int, str]:
    return (profile.compute_slices, profile.memory_slices, profile.name)


def _seven(one: str, one_double: str, two: str, three: str, four: str, seven: str | None) -> _Mig:
    """A 7x8 part's profile names per shape, plus the `+me` variant of its 1g profile (every 7x8 part has one)."""
    shapes = {"1g": one, "1g2": one_double, "2g": two, "3g": three, "4g": four}
    if seven is not None:
        shapes["7g"] = seven
    return _Mig("7x8", shapes, (f"{one}+me",))


# Profile names per part: the MIG user guide's "Supported MIG Profiles" tables, `nvidia-smi mig -lgip` listings in
# NVIDIA's mig-parted and gpu-operator pull requests, and mig-parted's default config.
_A100_40GB = _seven("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_A100_80GB = _seven("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_H100_94GB = _seven("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
_HOPPER_96GB = _seven("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb")
_H200_141GB = _seven("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
_GH200_144GB = _seven("1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb")
_B200 = _seven("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")
# GB200: the names production boards report (mig-parted#227/#228; pre-production boards said 1g.24gb and 3g.95gb).
# Its whole-GPU profile is left out: listings disagree between 7g.186gb and 7g.189gb.
_GB200 = _seven("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", None)
_A30 = _Mig("4x4", {"1g": "1g.6gb", "2g": "2g.12gb", "4g": "4g.24gb"}, ("1g.6gb+me", "2g.12gb+me"))
# RTX PRO 6000 Blackwell Server Edition: 4 slices of 24 GB, with graphics (+gfx), all-media (+me.all) and
# no-media (-me) variants, as its `nvidia-smi mig -lgip` lists them.
_RTX_PRO_6000 = _Mig(
    "4x4",
    {"1g": "1g.24gb", "2g": "2g.48gb", "4g": "4g.96gb"},
    (
        "1g.24gb+me",
        "1g.24gb+me.all",
        "1g.24gb-me",
        "1g.24gb+gfx",
        "2g.48gb+me.all",
        "2g.48gb-me",
        "2g.48gb+gfx",
        "4g.96gb+gfx",
    ),
)

# name, architecture, memory GB, PCI device IDs, first driver branch, Slurm type, MIG profiles (None: no MIG).
# First driver branches: A100 R450, H100 R525, H200 R550 and B200 R570 as DESIGN.md section 7 gives them (H100 was
# first listed in the short-lived R520 feature branch; R525 is its first production branch). The others are the
# first production branch that lists the part, taken from release notes and not checked release by release; the
# RTX PRO 6000 Server Edition's R575 is the least certain.
# Open kernel modules: supported from Turing on, required on Blackwell (derived from the architecture below).
_Row = tuple[str, Architecture, int, tuple[str, ...], int, str, _Mig | None]
_MODELS: tuple[_Row, ...] = (
    ("V100-SXM2-16GB", "volta", 16, ("0x1DB1", "0x1DF5"), 384, "v100", None),
    ("V100-SXM2-32GB", "volta", 32, ("0x1DB5",), 384, "v100", None),
    ("V100-PCIE-16GB", "volta", 16, ("0x1DB4",), 384, "v100", None),
    ("V100-PCIE-32GB", "volta", 32, ("0x1DB6",), 384, "v100", None),
    ("V100S-PCIE-32GB", "volta", 32, ("0x1DF6",), 418, "v100s", None),
    ("T4", "turing", 16, ("0x1EB8",), 410, "t4", None),
    ("A10", "ampere", 24, ("0x2236",), 460, "a10", None),
    ("A30", "ampere", 24, ("0x20B7",), 460, "a30", _A30),
    ("A40", "ampere", 48, ("0x2235",), 460, "a40", None),
    ("A100-SXM4-40GB", "ampere", 40, ("0x20B0",), 450, "a100", _A100_40GB),
    ("A100-PCIE-40GB", "ampere", 40, ("0x20B1", "0x20F1"), 450, "a100", _A100_40GB),
    ("A100-SXM4-80GB", "ampere", 80, ("0x20B2",), 450, "a100", _A100_80GB),
    ("A100-PCIE-80GB", "ampere", 80, ("0x20B5",), 460, "a100", _A100_80GB),
    ("A800-SXM4-80GB", "ampere", 80, ("0x20F3",), 470, "a800", _A100_80GB),
    ("A800-PCIE-80GB", "ampere", 80, ("0x20F5",), 470, "a800", _A100_80GB),
    ("A800-PCIE-40GB", "ampere", 40, ("0x20F6",), 470, "a800", _A100_40GB),
    ("L4", "ada", 24, ("0x27B8",), 525, "l4", None),
    ("L40", "ada", 48, ("0x26B5",), 525, "l40", None),
    ("L40S", "ada", 48, ("0x26B9",), 535, "l40s", None),
    ("H100-SXM5-80GB", "hopper", 80, ("0x2330",), 525, "h100", _A100_80GB),
    ("H100-PCIE-80GB", "hopper", 80, ("0x2331",), 525, "h100", _A100_80GB),
    ("H800-SXM5-80GB", "hopper", 80, ("0x2324",), 525, "h800", _A100_80GB),
    ("H800-PCIE-80GB", "hopper", 80, ("0x2322",), 525, "h800", _A100_80GB),
    ("H100-NVL", "hopper", 94, ("0x2321",), 535, "h100", _H100_94GB),
    ("H20", "hopper", 96, ("0x2329",), 535, "h20", _HOPPER_96GB),
    ("GH200-96GB", "hopper", 96, ("0x2342",), 535, "gh200", _HOPPER_96GB),
    ("GH200-144GB", "hopper", 144, ("0x2348",), 550, "gh200", _GH200_144GB),
    ("H200-SXM5-141GB", "hopper", 141, ("0x2335",), 550, "h200", _H200_141GB),
    ("H200-NVL", "hopper", 141, ("0x233B",), 550, "h200", _H200_141GB),
    ("B200", "blackwell", 180, ("0x2901",), 570, "b200", _B200),
    ("GB200", "blackwell", 186, ("0x2941",), 570, "gb200", _GB200),
    ("RTX-PRO-6000-Blackwell-Server", "blackwell", 96, ("0x2BB5",), 575, "rtx_pro_6000", _RTX_PRO_6000),
)

# The socketed (SXM) parts and the Grace superchips: the GPUs of NVSwitch boards. HGX H20 is SXM, though not named so.
_NVSWITCH_BOARDS = frozenset(
    {row[0] for row in _MODELS if "-SXM" in row[0]} | {"H20", "B200", "GB200", "GH200-96GB", "GH200-144GB"}
)

_NO_OPEN: frozenset[Architecture] = frozenset({"volta"})
_OPEN_ONLY: frozenset[Architecture] = frozenset({"blackwell"})


def _spec(row: _Row) -> GpuSpec:
    name, arch, memory, pci_ids, branch, slurm_type, mig = row
    profiles: MappingProxyType[str, MigProfile] = MappingProxyType({})
    compute = memory_slices = 0
    exclusive: frozenset[frozenset[int]] = frozenset()
    if mig is not None:
        profiles = _mig_table(mig)
        compute, memory_slices, _ = _GEOMETRIES[mig.geometry]
        exclusive = _EXCLUSIVE[mig.geometry]
    return GpuSpec(
        name=name,
        architecture=arch,
        memory_gb=memory,
        pci_ids=pci_ids,
        min_driver_branch=branch,
        supports_open_modules=arch not in _NO_OPEN,
        requires_open_modules=arch in _OPEN_ONLY,
        slurm_type=slurm_type,
        nvswitch_board=name in _NVSWITCH_BOARDS,
        mig_profiles=profiles,
        mig_compute_slices=compute,
        mig_memory_slices=memory_slices,
        mig_exclusive_sizes=exclusive,
    )


@cache
def _catalog() -> dict[str, GpuSpec]:
    return {row[0]: _spec(row) for row in _MODELS}


@cache
def _by_folded_name() -> dict[str, GpuSpec]:
    return {name.casefold(): spec for name, spec in _catalog().items()}


@cache
def _by_pci() -> dict[str, GpuSpec]:
    return {pci: spec for spec in _catalog().values() for pci in spec.pci_ids}


def names() -> list[str]:
    """Every catalogued model name, in catalog order (oldest architecture first)."""
    return list(_catalog())


def specs() -> list[GpuSpec]:
    return list(_catalog().values())


def lookup(name: str) -> GpuSpec | None:
    """The model of that exact name, or else of that name in any letter case."""
    return _catalog().get(name) or _by_folded_name().get(name.casefold())


_PCI = re.compile(r"^(?:0x)?([0-9a-fA-F]{4})([0-9a-fA-F]{4})?$")


def normalise_pci_id(pci_id: str) -> str | None:
    """ "0x233010DE" (mig-parted), "0x2330" or "2330" -> "0x2330"; None if it is not an NVIDIA device ID."""
    match = _PCI.match(pci_id.strip())
    if match is None:
        return None
    device, vendor = match.groups()
    if vendor is not None and vendor.upper() != NVIDIA_VENDOR:
        return None
    return f"0x{device.upper()}"


def by_pci_id(pci_id: str) -> GpuSpec | None:
    """The model with that PCI device ID, given as mig-parted writes it ("0x233010DE") or alone ("0x2330")."""
    device = normalise_pci_id(pci_id)
    return _by_pci().get(device) if device else None


# --- Operating systems ------------------------------------------------------------------------------------------
# What each supported Debian release's archive carries, read from its package indexes (deb.debian.org, Debian 12.15
# and 13.8 point releases): the driver of the `distribution` source (nvidia-kernel-dkms and nvidia-open-kernel-dkms
# from non-free/contrib, the same branch in the release's backports), the kernel series, Slurm and munge. Versions
# move with point releases and security updates inside a branch (bookworm-security has 535.309.01); the branch is
# what the rules check. The archives' nvidia-tesla-<branch>-* packages (Debian 12: 470, 525, 535; Debian 13: 535)
# carry other package and module names, which the nvidia_driver role does not install.
# Ubuntu and RHEL have no row: nothing is checked for them here.


@dataclass(frozen=True)
class ArchiveDriver:
    branch: int
    version: str
    """The version of the release's nvidia-kernel-dkms when the row was written, for messages."""


@dataclass(frozen=True)
class OsRelease:
    name: str
    """The cluster file's `os` value."""
    title: str
    codename: str
    kernel: str
    """The kernel series of the archive's linux-image-amd64."""
    slurm: str
    """The archive's slurm-wlm version; its first two fields are the Slurm release."""
    munge: str
    driver: ArchiveDriver
    backports_driver: ArchiveDriver | None

    @property
    def slurm_release(self) -> str:
        return ".".join(self.slurm.split(".")[:2])


_OS_RELEASES: tuple[OsRelease, ...] = (
    OsRelease(
        "debian12", "Debian 12 (bookworm)", "bookworm", "6.1", "22.05.8", "0.5.15",
        ArchiveDriver(535, "535.261.03"), ArchiveDriver(535, "535.216.03"),
    ),
    OsRelease(
        "debian13", "Debian 13 (trixie)", "trixie", "6.12", "24.11.5", "0.5.16",
        ArchiveDriver(550, "550.163.01"), ArchiveDriver(550, "550.163.01"),
    ),
)  # fmt: skip


def os_release(name: str) -> OsRelease | None:
    """The archive facts of the cluster file's `os` value, or None where gpuinfra keeps none (Ubuntu, RHEL)."""
    return next((release for release in _OS_RELEASES if release.name == name), None)


def os_releases() -> list[OsRelease]:
    return list(_OS_RELEASES)


# Slurm's major releases in order. slurmdbd must be at least as new as slurmctld, and slurmctld at least as new as
# slurmd and the commands; a daemon talks to the releases just before its own: two of them up to 24.05, three from
# 24.11 on (Slurm's upgrade guide, "Compatibility Window").
SLURM_RELEASES: tuple[str, ...] = ("20.11", "21.08", "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11")


def slurm_compatible(newer: str, older: str) -> bool:
    """Whether a daemon of Slurm release `newer` accepts one of release `older` (e.g. slurmctld and slurmd)."""
    new, old = SLURM_RELEASES.index(newer), SLURM_RELEASES.index(older)
    window = 3 if new >= SLURM_RELEASES.index("24.11") else 2
    return 0 <= new - old <= window


# Containers in Slurm jobs: the release sources gpuinfra builds its enroot and pyxis packages from, pinned by
# checksum. Neither is packaged by Debian; the tarballs are `git archive` of each project's release tag.
@dataclass(frozen=True)
class SourceTarball:
    file: str
    sha256: str
    url: str
    """Where the release is published, for the error that names a missing file."""


CONTAINER_SOURCES: tuple[SourceTarball, ...] = (
    SourceTarball(
        "enroot-4.1.2.tar.gz",
        "817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3",
        "https://github.com/NVIDIA/enroot/archive/refs/tags/v4.1.2.tar.gz",
    ),
    # The one enroot submodule a glibc build needs (deps/makeself), at the commit enroot 4.1.2 pins.
    SourceTarball(
        "makeself-5742be6.tar.gz",
        "9d01d16b362ad56d968945798f166ceddd5d893acc5967ae616f3f429ef9c39e",
        "https://github.com/megastep/makeself/archive/5742be6410bfad2c619fb1e98bf795e8fa0913c7.tar.gz",
    ),
    SourceTarball(
        "pyxis-0.24.0.tar.gz",
        "063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681",
        "https://github.com/NVIDIA/pyxis/archive/refs/tags/v0.24.0.tar.gz",
    ),
)


# --- Active checks: conservative bandwidth floors ---------------------------------------------------------------
# What the admission gate's bandwidth checks (plugins/module_utils/active_checks.py) compare a node with. These are
# FLOORS, set well under what a healthy node measures, not expected values: a floor catches a broken or degraded link
# (an NVLink down, a GPU trained at x4 or a lower PCIe generation, a NUMA-misplaced copy), never a slow-but-healthy
# run. Each is a fraction of a link's per-direction peak, from the datasheet figures below.
#
# Per model: the GPU's host interface (its highest PCIe generation, or NVLink-C2C to a Grace CPU) and its total
# NVLink bandwidth, both directions added, as NVIDIA's datasheets give them (V100 300 GB/s; A100 600; A800 and H800
# 400; H100 SXM, H20, H200 and GH200 900; B200 and GB200 1800). On PCIe cards the NVLink figure is that of the
# optional bridge to one other card (A30 200, A40 112.5, A100 PCIe 600, A800/H800 PCIe 400, H100 PCIe and H100 NVL
# 600, H200 NVL 900): it is recorded, not used, since a bridge may not be fitted and traffic between unbridged cards
# crosses PCIe. B200 is capped at Gen5 here: whether it trains at Gen6 could not be confirmed, and a lower cap only
# lowers its floor. T4 and V100 are Gen3 parts; A-series and Ada parts Gen4; Hopper and Blackwell PCIe parts Gen5.


@dataclass(frozen=True)
class Interconnect:
    pcie_gen: int
    """The highest PCIe generation of the GPU's host interface (x16)."""
    nvlink_gbps: float
    """Total NVLink bandwidth of one GPU, both directions added (datasheet); 0 without NVLink."""
    c2c_gbps: float = 0
    """NVLink-C2C to the Grace CPU, both directions added (Grace superchips): the host link in place of PCIe."""


# fmt: off
_INTERCONNECTS: dict[str, Interconnect] = {
    "V100-SXM2-16GB": Interconnect(3, 300), "V100-SXM2-32GB": Interconnect(3, 300),
    "V100-PCIE-16GB": Interconnect(3, 0), "V100-PCIE-32GB": Interconnect(3, 0), "V100S-PCIE-32GB": Interconnect(3, 0),
    "T4": Interconnect(3, 0),
    "A10": Interconnect(4, 0), "A30": Interconnect(4, 200), "A40": Interconnect(4, 112.5),
    "A100-SXM4-40GB": Interconnect(4, 600), "A100-PCIE-40GB": Interconnect(4, 600),
    "A100-SXM4-80GB": Interconnect(4, 600), "A100-PCIE-80GB": Interconnect(4, 600),
    "A800-SXM4-80GB": Interconnect(4, 400), "A800-PCIE-80GB": Interconnect(4, 400),
    "A800-PCIE-40GB": Interconnect(4, 400),
    "L4": Interconnect(4, 0), "L40": Interconnect(4, 0), "L40S": Interconnect(4, 0),
    "H100-SXM5-80GB": Interconnect(5, 900), "H100-PCIE-80GB": Interconnect(5, 600),
    "H800-SXM5-80GB": Interconnect(5, 400), "H800-PCIE-80GB": Interconnect(5, 400),
    "H100-NVL": Interconnect(5, 600), "H20": Interconnect(5, 900),
    "GH200-96GB": Interconnect(5, 900, c2c_gbps=900), "GH200-144GB": Interconnect(5, 900, c2c_gbps=900),
    "H200-SXM5-141GB": Interconnect(5, 900), "H200-NVL": Interconnect(5, 900),
    "B200": Interconnect(5, 1800), "GB200": Interconnect(5, 1800, c2c_gbps=900),
    "RTX-PRO-6000-Blackwell-Server": Interconnect(5, 0),
}
# fmt: on

# A PCIe link's per-direction bandwidth, x16: transfer rate (GT/s per lane) x encoding (8b/10b to Gen2, 128b/130b
# from Gen3) x 16 lanes / 8 bits (PCI-SIG's base specifications): Gen3 15.75 GB/s, Gen4 31.5, Gen5 63.0.
_PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}

# The fractions of a link's per-direction peak each floor is set at. Healthy nodes measure well above them:
# nvbandwidth's README shows ~26 GB/s host-to-device copies (83% of Gen4's 31.5) on an 8-GPU board whose 276 GB/s
# GPU-to-GPU copies are an HGX A100's; published all_reduce_perf runs on HGX A100 and H100 boards report busbw of
# roughly 230 and 360-480 GB/s against NVLink's 300 and 450 per direction (not measured here: no GPU was at hand).
# All-reduce over PCIe alone (no NVSwitch) depends on the board's PCIe switches and on whether peer-to-peer copies
# work, hence its low fraction. Tighten these with recordings from real nodes, never loosen them to pass one.
NCCL_NVLINK_FRACTION = 0.6
NCCL_PCIE_FRACTION = 0.25
HOST_LINK_FRACTION = 0.6


@dataclass(frozen=True)
class ActiveFloor:
    gbps: float
    """The floor, GB/s (decimal, as nccl-tests and nvbandwidth print)."""
    of: str
    """What it is the floor of, for a drain reason: "H100-SXM5-80GB", "L4 at PCIe Gen4"."""
    basis: str
    """How it was derived, one line."""


def interconnect(name: str) -> Interconnect | None:
    spec = lookup(name)
    return _INTERCONNECTS.get(spec.name) if spec else None


def pcie_x16_gbps(generation: int) -> float:
    """A PCIe x16 link's bandwidth in one direction, GB/s."""
    encoding = 0.8 if generation <= 2 else 128 / 130
    return _PCIE_GTS[generation] * encoding * 16 / 8


def _model(name: str, pcie_gen: int) -> tuple[GpuSpec, Interconnect, int]:
    spec = lookup(name)
    link = _INTERCONNECTS.get(spec.name) if spec else None
    if spec is None or link is None:
        raise ValueError(f"no bandwidth floors for GPU model {name!r}")
    if pcie_gen not in _PCIE_GTS:
        raise ValueError(f"PCIe generation {pcie_gen} is not one of {sorted(_PCIE_GTS)}")
    # A GPU in a newer slot trains at its own generation; in an older slot, at the slot's.
    return spec, link, min(pcie_gen, link.pcie_gen)


def _down(value: float) -> float:
    """Rounded down to 0.1 GB/s: rounding must not raise a floor."""
    return int(value * 10 + 1e-9) / 10


def nccl_all_reduce_floor(name: str, pcie_gen: int) -> ActiveFloor:
    """The floor of all_reduce_perf's bus bandwidth at large messages over all of a node's GPUs. On NVSwitch boards,
    a fraction of the per-direction NVLink bandwidth; elsewhere, of the PCIe link at `pcie_gen` (the generation the
    node's GPUs train at, as nvidia-smi's maximum link generation reports it)."""
    spec, link, gen = _model(name, pcie_gen)
    if spec.nvswitch_board and link.nvlink_gbps:
        per_direction = link.nvlink_gbps / 2
        basis = f"{NCCL_NVLINK_FRACTION:.0%} of NVLink's {per_direction:g} GB/s per direction"
        return ActiveFloor(_down(per_direction * NCCL_NVLINK_FRACTION), spec.name, basis)
    pcie = pcie_x16_gbps(gen)
    basis = f"{NCCL_PCIE_FRACTION:.0%} of PCIe Gen{gen} x16's {pcie:.2f} GB/s per direction"
    return ActiveFloor(_down(pcie * NCCL_PCIE_FRACTION), f"{spec.name} at PCIe Gen{gen}", basis)


def host_bandwidth_floor(name: str, pcie_gen: int) -> ActiveFloor:
    """The floor of each GPU's host_to_device and device_to_host copy bandwidth (nvbandwidth's CE memcpy tests): a
    fraction of the host link's per-direction bandwidth, PCIe x16 at `pcie_gen` or NVLink-C2C on Grace superchips."""
    spec, link, gen = _model(name, pcie_gen)
    if link.c2c_gbps:
        per_direction = link.c2c_gbps / 2
        basis = f"{HOST_LINK_FRACTION:.0%} of NVLink-C2C's {per_direction:g} GB/s per direction"
        return ActiveFloor(_down(per_direction * HOST_LINK_FRACTION), f"{spec.name} over NVLink-C2C", basis)
    pcie = pcie_x16_gbps(gen)
    basis = f"{HOST_LINK_FRACTION:.0%} of PCIe Gen{gen} x16's {pcie:.2f} GB/s per direction"
    return ActiveFloor(_down(pcie * HOST_LINK_FRACTION), f"{spec.name} at PCIe Gen{gen}", basis)


# --- XIDs -------------------------------------------------------------------------------------------------------
# NVIDIA's XID catalog and the class each XID gets: one table, plugins/module_utils/xid_catalog.py, which the nodes'
# health checks import beside them; the controller reads it from there, so the two never differ.

_XIDS = module_util("xid_catalog")

XID_CLASSES: tuple[str, ...] = tuple(_XIDS.CLASSES)
"""application, ignore, node, reset, reboot, hardware (xid_catalog.py says what each does to a node)."""
XID_DRAINING: frozenset[str] = frozenset(_XIDS.DRAINING)
XID_MAX: int = int(_XIDS.XID_MAX)
XID_SOURCE: str = str(_XIDS.SOURCE)
XID_VERSION: str = str(_XIDS.VERSION)


@dataclass(frozen=True)
class XidEntry:
    xid: int
    mnemonic: str
    bucket: str
    """NVIDIA's immediate action (resolution bucket)."""
    xid_class: str
    note: str


def xid_entries() -> list[XidEntry]:
    """The XIDs the catalog lists, in number order."""
    return [XidEntry(e.xid, e.mnemonic, e.bucket, e.xid_class, e.note) for _, e in sorted(_XIDS.CATALOG.items())]


def xid_class(xid: int, message: str = "", overrides: dict[int, str] | None = None) -> str:
    """The class of an XID: the site's override, else the catalog's (XID 154's from its message), else `node`."""
    if overrides and xid in overrides:
        return overrides[xid]
    return str(_XIDS.catalog_class(xid, message))
