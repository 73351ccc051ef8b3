"""MIG layouts: NVIDIA's documented combinations pack, impossible ones do not (with messages that say why), the
search agrees with brute force, and mig-parted v1 files are read and written faithfully."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuinfra import catalog
from gpuinfra import mig_layouts as mig
from gpuinfra.catalog import GpuSpec
from gpuinfra.errors import InvalidInput
from gpuinfra.validate.load import load_mig_parted
from gpuinfra.validate.source import read_yaml, to_plain

DATA = Path(__file__).parent / "data" / "mig-parted"
MIG_SPECS = [s for s in catalog.specs() if s.mig_capable]
EIGHT_SLICE = [s for s in MIG_SPECS if s.mig_memory_slices == 8]


def spec_of(name: str) -> GpuSpec:
    spec = catalog.lookup(name)
    assert spec is not None, name
    return spec


def shapes(spec: GpuSpec) -> dict[str, str]:
    """Shape -> this model's plain profile name: "1g" (one memory slice), "1g2" (two), "2g", "3g", "4g", "7g"."""
    out = {}
    for name, p in spec.mig_profiles.items():
        if "+" in name or "-" in name:
            continue
        out["1g2" if (p.compute_slices, p.memory_slices) == (1, 2) else f"{p.compute_slices}g"] = name
    return out


def layout_of(spec: GpuSpec, shape_list: list[str]) -> dict[str, int] | None:
    names = shapes(spec)
    if any(s not in names for s in shape_list):
        return None
    return dict(Counter(names[s] for s in shape_list))


# NVIDIA's supported combinations for 7-compute/8-memory-slice parts (MIG user guide, A100 and H100 sections),
# by shape. The same shapes hold on every such part; only the memory in the names differs.
DOCUMENTED_EIGHT_SLICE = [
    ["7g"],
    ["4g", "2g", "1g"],
    ["4g", "1g", "1g", "1g"],
    ["3g", "3g"],
    ["3g", "2g", "1g"],
    ["3g", "2g", "1g", "1g"],
    ["3g", "1g", "1g", "1g"],
    ["3g", "2g", "2g"],
    ["2g", "2g", "2g", "1g"],
    ["2g", "2g", "1g", "1g", "1g"],
    ["2g", "1g", "1g", "1g", "1g", "1g"],
    ["1g"] * 7,
    ["1g2"] * 4,
]
IMPOSSIBLE_EIGHT_SLICE = [
    ["1g"] * 8,  # a count past the maximum
    ["1g2"] * 5,
    ["2g"] * 4,
    ["3g", "3g", "1g"],  # 7 compute slices, but 9 memory slices
    ["4g", "3g"],  # slots 0-3 and 4-7, yet never combined
    ["7g", "1g"],
    ["7g", "7g"],
    ["4g", "2g", "2g"],  # 8 compute slices
    ["2g", "2g", "2g", "1g", "1g"],
]


def catalogued(combinations: list[list[str]]) -> list[Any]:
    """Each (GPU, combination) whose every shape the GPU's catalogue has a profile for (GB200 has no 7g, say)."""
    return [
        pytest.param(spec, layout, id=f"{'+'.join(combination)}-{spec.name}")
        for combination in combinations
        for spec in EIGHT_SLICE
        if (layout := layout_of(spec, combination)) is not None
    ]


@pytest.mark.parametrize(("spec", "layout"), catalogued(DOCUMENTED_EIGHT_SLICE))
def test_documented_combinations_pack(spec: GpuSpec, layout: Any) -> None:
    assert mig.check_layout(spec, layout) == []
    assert_valid_placement(spec, layout, mig.place(spec, layout))


@pytest.mark.parametrize(("spec", "layout"), catalogued(IMPOSSIBLE_EIGHT_SLICE))
def test_impossible_combinations_are_rejected(spec: GpuSpec, layout: Any) -> None:
    assert len(mig.check_layout(spec, layout)) == 1
    assert mig.place(spec, layout) is None


@pytest.mark.parametrize(
    "layout",
    [
        {"1g.6gb": 4},
        {"2g.12gb": 1, "1g.6gb": 2},
        {"2g.12gb": 2},
        {"4g.24gb": 1},
        {"1g.6gb+me": 1, "1g.6gb": 3},
        {"2g.12gb+me": 1, "2g.12gb": 1},
        {"2g.12gb+me": 1, "1g.6gb": 2},
    ],
)
def test_a30_documented_layouts_pack(layout: dict[str, int]) -> None:
    a30 = spec_of("A30")
    assert mig.check_layout(a30, layout) == []
    assert_valid_placement(a30, layout, mig.place(a30, layout))


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"1g.6gb": 5}, "5 x 1g.6gb is more than A30 holds: at most 4"),
        (
            {"4g.24gb": 1, "1g.6gb": 1},
            "4g.24gb + 1g.6gb does not fit on A30: it needs 5 compute slices and the GPU has 4",
        ),
        (
            {"1g.6gb+me": 1, "2g.12gb+me": 1},
            "1g.6gb+me and 2g.12gb+me both carry media extensions; A30 has one set, so one instance at most",
        ),
    ],
)
def test_a30_impossible_layouts_say_why(layout: dict[str, int], message: str) -> None:
    assert mig.check_layout(spec_of("A30"), layout) == [message]


A100_80 = "valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"


@pytest.mark.parametrize(
    ("layout", "messages"),
    [
        ({"1g.5gb": 7}, [f"'1g.5gb' is not a MIG profile of A100-SXM4-80GB ({A100_80})"]),
        (
            {"1g.5gb": 1, "2g.10gb": 1, "1g.10gb": 9},
            [
                f"'1g.5gb' is not a MIG profile of A100-SXM4-80GB ({A100_80})",
                f"'2g.10gb' is not a MIG profile of A100-SXM4-80GB ({A100_80})",
                "9 x 1g.10gb is more than A100-SXM4-80GB holds: at most 7",
            ],
        ),
        (
            {"3g.40gb": 2, "1g.10gb": 1},
            [
                "2 x 3g.40gb + 1g.10gb does not fit on A100-SXM4-80GB: it needs 9 memory slices and the GPU has 8 "
                "(3g.40gb takes 4, 1g.10gb takes 1), although its 7 compute slices would fit"
            ],
        ),
        (
            {"1g.10gb+me": 2},
            [
                "2 x 1g.10gb+me is more than A100-SXM4-80GB holds: at most 1 (an instance with media extensions takes "
                "the GPU's only set of them)"
            ],
        ),
        (
            {"4g.40gb": 1, "3g.40gb": 1},
            [
                "4g.40gb + 3g.40gb does not fit on A100-SXM4-80GB: NVIDIA supports no combination of a 4g.40gb and a "
                "3g.40gb instance on one GPU"
            ],
        ),
        (
            {"7g.80gb": 1, "1g.10gb": 1},
            ["7g.80gb + 1g.10gb does not fit on A100-SXM4-80GB: it needs 8 compute slices and the GPU has 7"],
        ),
        ({"2g.20gb": 0}, ["the count of 2g.20gb must be a whole number of at least 1, not 0"]),
    ],
)
def test_problems_are_named_exactly(layout: dict[str, int], messages: list[str]) -> None:
    assert mig.check_layout(spec_of("A100-SXM4-80GB"), layout) == messages


def test_media_variants_count_together() -> None:
    rtx = spec_of("RTX-PRO-6000-Blackwell-Server")
    assert mig.check_layout(rtx, {"1g.24gb+me.all": 1, "1g.24gb+gfx": 3}) == []
    assert mig.check_layout(rtx, {"1g.24gb-me": 4}) == []
    assert mig.check_layout(rtx, {"2g.48gb+gfx": 1, "1g.24gb+gfx": 2}) == []
    assert mig.check_layout(rtx, {"1g.24gb+me": 1, "2g.48gb+me.all": 1}) == [
        "1g.24gb+me and 2g.48gb+me.all both carry media extensions; RTX-PRO-6000-Blackwell-Server has one set, "
        "so one instance at most"
    ]
    assert mig.check_layout(spec_of("H100-SXM5-80GB"), {"1g.10gb+gfx": 1})[0].startswith(
        "'1g.10gb+gfx' is not a MIG profile of H100-SXM5-80GB"
    )


def test_a_part_without_mig_takes_no_layout() -> None:
    assert mig.check_layout(spec_of("L4"), {"1g.6gb": 1}) == ["L4 does not support MIG"]
    assert mig.place(spec_of("L4"), {"1g.6gb": 1}) is None


def test_place_returns_slot_order_and_none_for_unknown_profiles() -> None:
    h100 = spec_of("H100-SXM5-80GB")
    assert mig.place(h100, {"1g.10gb": 1, "2g.20gb": 1, "4g.40gb": 1}) == [
        ("4g.40gb", 0),
        ("2g.20gb", 4),
        ("1g.10gb", 6),
    ]
    assert mig.place(h100, {"3g.40gb": 1, "2g.20gb": 2}) == [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert mig.place(h100, {"1g.5gb": 1}) is None
    assert mig.place(h100, {}) == []


def test_results_are_memoised_per_model_and_layout() -> None:
    mig._problems_cached.cache_clear()
    h200 = spec_of("H200-SXM5-141GB")
    for _ in range(1000):
        assert mig.check_layout(h200, {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}) == []
    info = mig._problems_cached.cache_info()
    assert (info.misses, info.hits) == (1, 999)
    # A count of True is not the count 1, although the two hash alike.
    assert mig.check_layout(h200, {"7g.141gb": 1}) == []
    assert mig.check_layout(h200, {"7g.141gb": True}) == [
        "the count of 7g.141gb must be a whole number of at least 1, not True"
    ]


# --- the search against brute force ------------------------------------------------------------------------------


def assert_valid_placement(spec: GpuSpec, layout: Mapping[str, int], placed: list[tuple[str, int]] | None) -> None:
    assert placed is not None
    assert Counter(name for name, _ in placed) == Counter({k: v for k, v in layout.items() if v})
    taken: set[int] = set()
    for name, start in placed:
        profile = spec.mig_profiles[name]
        assert start in profile.start_slots
        slots = set(range(start, start + profile.memory_slices))
        assert max(slots) < spec.mig_memory_slices
        assert not slots & taken, f"{name} at {start} overlaps"
        taken |= slots
    assert sum(spec.mig_profiles[name].compute_slices for name, _ in placed) <= spec.mig_compute_slices


def brute_force_fits(spec: GpuSpec, layout: Mapping[str, int]) -> bool:
    """Independent of `mig`: try every start slot for every instance, in the order given, with no pruning beyond
    overlap; the non-geometric rules (compute, media, sizes NVIDIA never combines) checked as stated."""
    instances = [spec.mig_profiles[name] for name, count in layout.items() for _ in range(count)]
    if sum(p.compute_slices for p in instances) > spec.mig_compute_slices:
        return False
    if sum(p.memory_slices for p in instances) > spec.mig_memory_slices:
        return False  # no placement can overlap nothing then; this only saves time
    if sum(p.media_extensions for p in instances) > 1:
        return False
    sizes = {p.compute_slices for p in instances}
    if any(pair <= sizes for pair in spec.mig_exclusive_sizes):
        return False

    def assign(index: int, taken: frozenset[int]) -> bool:
        if index == len(instances):
            return True
        p = instances[index]
        for start in p.start_slots:
            slots = frozenset(range(start, start + p.memory_slices))
            if not slots & taken and assign(index + 1, taken | slots):
                return True
        return False

    return assign(0, frozenset())


@st.composite
def spec_and_layout(draw: st.DrawFn) -> tuple[GpuSpec, dict[str, int]]:
    spec = draw(st.sampled_from(MIG_SPECS))
    names = draw(st.lists(st.sampled_from(list(spec.mig_profiles)), min_size=1, max_size=4, unique=True))
    return spec, {name: draw(st.integers(1, spec.mig_profiles[name].max_count + 1)) for name in names}


@settings(max_examples=400, deadline=None)
@given(spec_and_layout())
def test_search_agrees_with_brute_force(case: tuple[GpuSpec, dict[str, int]]) -> None:
    spec, layout = case
    problems = mig.check_layout(spec, layout)
    placed = mig.place(spec, layout)
    if problems:
        assert placed is None
        assert not brute_force_fits(spec, layout)
    else:
        assert brute_force_fits(spec, layout)
        assert_valid_placement(spec, layout, placed)


@pytest.mark.parametrize("spec", MIG_SPECS, ids=[s.name for s in MIG_SPECS])
def test_every_sub_layout_of_a_packing_layout_packs(spec: GpuSpec) -> None:
    """Removing an instance never breaks a placement: checked on every maximal layout of the documented list."""
    for combination in DOCUMENTED_EIGHT_SLICE if spec.mig_memory_slices == 8 else [["1g"] * 4, ["2g", "1g", "1g"]]:
        layout = layout_of(spec, combination)
        if layout is None:
            continue
        for name in layout:
            smaller = {**layout, name: layout[name] - 1}
            assert mig.place(spec, smaller) is not None, (spec.name, smaller)


# --- mig-parted v1 -----------------------------------------------------------------------------------------------


def parted(name: str) -> Any:
    return to_plain(read_yaml(DATA / name).data)


def test_a_good_file_has_no_problems_and_its_uniform_layouts_are_found() -> None:
    configs, problems = mig.parse_parted(parted("good.yaml"))
    assert problems == []
    assert list(configs) == ["all-disabled", "halves", "mixed-small", "sevenths", "split", "video"]
    assert mig.uniform_layouts(configs) == {
        "halves": {"3g.40gb": 2},
        "sevenths": {"1g.10gb": 7},
        "video": {"1g.18gb+me": 1, "1g.18gb": 6},
    }


def test_a_bad_file_reports_every_problem_with_its_path() -> None:
    _configs, problems = mig.parse_parted(parted("bad.yaml"))
    assert [(p.path, p.message, p.severity) for p in problems] == [
        (("mig-configz",), "unknown key 'mig-configz'; did you mean 'mig-configs'?", "error"),
        (
            ("mig-configs", "balanced", 0, "mig-devices", "1g.5gb"),
            f"'1g.5gb' is not a MIG profile of A100-SXM4-80GB ({A100_80})",
            "error",
        ),
        (
            ("mig-configs", "too-much-memory", 0, "mig-devices"),
            "2 x 3g.40gb + 1g.10gb does not fit on H100-SXM5-80GB: it needs 9 memory slices and the GPU has 8 "
            "(3g.40gb takes 4, 1g.10gb takes 1), although its 7 compute slices would fit",
            "error",
        ),
        (
            ("mig-configs", "two-media", 0, "mig-devices"),
            "1g.6gb+me and 2g.12gb+me both carry media extensions; A30 has one set, so one instance at most",
            "error",
        ),
        (
            ("mig-configs", "unknown-gpu", 0, "device-filter"),
            "PCI ID 0x99990000 names vendor 0000, not NVIDIA; its layout is not checked",
            "warning",
        ),
        (
            ("mig-configs", "not-catalogued", 0, "device-filter"),
            "PCI device 0x123410DE is not in the GPU catalog; its layout is not checked",
            "warning",
        ),
        (("mig-configs", "form", 0, "mig-devcies"), "unknown key 'mig-devcies'; did you mean 'mig-devices'?", "error"),
        (("mig-configs", "form", 0, "devices"), "`devices` is `all` or a list of GPU indices such as [0, 1]", "error"),
        (("mig-configs", "form", 0, "mig-enabled"), "`mig-enabled` is true or false, not 'yes'", "error"),
        (("mig-configs", "form", 1, "mig-devices"), "`mig-devices` needs `mig-enabled: true`", "error"),
        (
            ("mig-configs", "form", 2, "mig-devices", "one-g"),
            "'one-g' is not a MIG profile name (such as 1g.10gb, 3g.40gb or 1g.10gb+me)",
            "error",
        ),
        (
            ("mig-configs", "form", 2, "mig-devices", "2g.20gb"),
            "the count of 2g.20gb must be a whole number of at least 1, not 0",
            "error",
        ),
    ]


def test_a_filter_checks_the_layout_on_every_model_it_names() -> None:
    doc = {
        "version": "v1",
        "mig-configs": {
            "c": [
                {
                    "devices": "all",
                    "mig-enabled": True,
                    "device-filter": ["0x20B010DE", "0x233010DE"],
                    "mig-devices": {"1g.10gb": 7},
                }
            ]
        },
    }
    _configs, problems = mig.parse_parted(doc)
    assert [(p.path, p.message) for p in problems] == [
        (("mig-configs", "c", 0, "mig-devices", "1g.10gb"), "7 x 1g.10gb is more than A100-SXM4-40GB holds: at most 4"),
    ]


@pytest.mark.parametrize(
    ("doc", "found"),
    [
        ([], [((), "a mig-parted file is a mapping with `version: v1` and `mig-configs`")]),
        (
            {"mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}},
            [((), "`version` is missing; add `version: v1`")],
        ),
        (
            {"version": "v2", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}},
            [(("version",), "version 'v2' is not supported; gpuinfra reads mig-parted v1")],
        ),
        ({"version": "v1"}, [((), "`mig-configs` is missing; add `mig-configs: {NAME: [...]}`")]),
        (
            {"version": "v1", "mig-configs": []},
            [(("mig-configs",), "`mig-configs` is a mapping of config name -> list of entries")],
        ),
        (
            {"version": "v1", "mig-configs": {"a": {}}},
            [(("mig-configs", "a"), "a config is a non-empty list of entries (`- devices: all ...`)")],
        ),
        (
            {"version": "v1", "mig-configs": {"a": ["all"]}},
            [
                (
                    ("mig-configs", "a", 0),
                    "an entry is a mapping with `devices`, `mig-enabled` and optionally "
                    "`device-filter` and `mig-devices`",
                )
            ],
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"mig-enabled": True}]}},
            [(("mig-configs", "a", 0), "`devices` is missing")],
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": [0, -1, True], "mig-enabled": True}]}},
            [(("mig-configs", "a", 0, "devices"), "`devices` is `all` or a list of GPU indices such as [0, 1]")],
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "device-filter": 7}]}},
            [
                (
                    ("mig-configs", "a", 0, "device-filter"),
                    '`device-filter` is a PCI ID such as "0x233010DE" or a list of them',
                )
            ],
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "device-filter": "0x2330"}]},
            },
            [
                (
                    ("mig-configs", "a", 0, "device-filter"),
                    "'0x2330' is not a PCI ID as mig-parted writes them (device then vendor, e.g. \"0x233010DE\")",
                )
            ],
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True, "mig-devices": [1]}]}},
            [
                (
                    ("mig-configs", "a", 0, "mig-devices"),
                    '`mig-devices` is a mapping of MIG profile -> count, such as {"1g.10gb": 7}',
                )
            ],
        ),
    ],
)
def test_form_problems(doc: object, found: list[tuple[tuple[str | int, ...], str]]) -> None:
    _configs, problems = mig.parse_parted(doc)
    assert [(p.path, p.message) for p in problems] == found


def test_profile_names_are_accepted_as_nvidia_writes_them() -> None:
    for name in ["1g.10gb", "1g.10gb+me", "1g.24gb+me.all", "1g.24gb-me", "2g.48gb+gfx", "1c.3g.40gb", "7g.141gb"]:
        assert mig.PROFILE_NAME.fullmatch(name), name
    for name in ["1g.10", "g.10gb", "1g.10gb+foo", "8c.1g.10gb", "1g.0gb", "1G.10GB", "9g.10gb"]:
        assert not mig.PROFILE_NAME.fullmatch(name), name


def test_entries_without_a_filter_are_checked_for_form_only() -> None:
    doc = {
        "version": "v1",
        "mig-configs": {
            "a": [
                {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7, "1g.5gb": 7}},
            ]
        },
    }
    assert mig.parse_parted(doc)[1] == []


def test_uniform_layouts_skip_per_index_mixed_and_empty_configs() -> None:
    configs = {
        "off": [{"devices": "all", "mig-enabled": False}],
        "empty": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
        "per-index": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}],
        "per-model": [
            {"devices": "all", "mig-enabled": True, "device-filter": "0x20B210DE", "mig-devices": {"1g.10gb": 7}},
            {"devices": "all", "mig-enabled": True, "device-filter": "0x20B010DE", "mig-devices": {"1g.5gb": 7}},
        ],
        "same-everywhere": [
            {"devices": "all", "mig-enabled": True, "device-filter": "0x20B210DE", "mig-devices": {"3g.40gb": 2}},
            {"devices": "all", "mig-enabled": True, "device-filter": "0x233010DE", "mig-devices": {"3g.40gb": 2}},
        ],
    }
    assert mig.uniform_layouts(configs) == {"same-everywhere": {"3g.40gb": 2}}


def test_render_parted_writes_one_filtered_entry_per_model() -> None:
    doc = mig.render_parted({"halves": {"3g.40gb": 2}}, ["A100-SXM4-80GB", "A100-PCIE-40GB"])
    assert doc == {
        "version": "v1",
        "mig-configs": {
            "halves": [
                {"devices": "all", "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"3g.40gb": 2}},
                {
                    "devices": "all",
                    "mig-enabled": True,
                    "device-filter": ["0x20B110DE", "0x20F110DE"],
                    "mig-devices": {"3g.40gb": 2},
                },
            ]
        },
    }
    assert list(doc["mig-configs"]["halves"][0]) == ["devices", "mig-enabled", "device-filter", "mig-devices"]


def test_render_then_parse_gives_the_layouts_back() -> None:
    layouts = {"sevenths": {"1g.10gb": 7}, "mixed": {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}}
    doc = mig.render_parted(layouts, ["A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB"])
    configs, problems = mig.parse_parted(doc)
    assert problems == []
    assert mig.uniform_layouts(configs) == layouts


def test_render_parted_rejects_a_model_outside_the_catalog() -> None:
    with pytest.raises(mig.UnknownGpuModel, match="'Z100' is not in the GPU catalog"):
        mig.render_parted({"a": {"1g.10gb": 7}}, ["Z100"])


def test_validate_reports_a_mig_parted_file_with_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DATA)
    assert load_mig_parted("good.yaml") == []
    with pytest.raises(InvalidInput) as caught:
        load_mig_parted("bad.yaml")
    found = [str(d) for d in caught.value.diagnostics]
    assert "bad.yaml:2:1: mig-configz: unknown key 'mig-configz'; did you mean 'mig-configs'?" in found
    assert (
        f"bad.yaml:9:9: mig-configs[balanced][0].mig-devices.1g.5gb: '1g.5gb' is not a MIG profile of "
        f"A100-SXM4-80GB ({A100_80})"
    ) in found
    assert (
        "bad.yaml:32:7: warning: mig-configs[not-catalogued][0].device-filter: PCI device 0x123410DE is not in "
        "the GPU catalog; its layout is not checked"
    ) in found
    assert len(found) == 12


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 9) | st.sampled_from(["all", "v1", "1g.10gb", "0x233010DE", "x"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "mig-configs",
                    "devices",
                    "mig-enabled",
                    "device-filter",
                    "mig-devices",
                    "1g.10gb",
                    "3g.40gb",
                    "a",
                    "b",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_document_gives_problems_never_a_traceback(doc: object) -> None:
    configs, problems = mig.parse_parted(doc)
    assert isinstance(configs, dict)
    for problem in problems:
        assert all(isinstance(part, (str, int)) for part in problem.path)
        assert problem.severity in ("error", "warning") and problem.message
    mig.uniform_layouts(configs)
