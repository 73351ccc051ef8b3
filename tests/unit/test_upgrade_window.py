"""The sliding window never exceeds max_unavailable, starts with a canary, and beats fixed batches."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuinfra.upgrade.journal import Journal, State
from gpuinfra.upgrade.rolling_window import RollingWindow, resolve_max_unavailable
from gpuinfra.upgrade.simulate import draw_durations, fixed_batches, optimum, simulate


def test_percentages_round_down_but_never_to_zero() -> None:
    assert resolve_max_unavailable("10%", 1000) == 100
    assert resolve_max_unavailable("5%", 10) == 1
    assert resolve_max_unavailable(3, 10) == 3


def test_canary_runs_alone_then_the_window_opens() -> None:
    window = RollingWindow([f"n{i}" for i in range(6)], max_unavailable=3, canary=1)
    assert window.startable() == ["n0"]
    window.started("n0")
    assert window.startable() == []
    window.finished("n0", ok=True)
    assert window.startable() == ["n1", "n2", "n3"]


def test_next_node_starts_when_any_node_finishes() -> None:
    window = RollingWindow([f"n{i}" for i in range(6)], max_unavailable=2, canary=0)
    for node in window.startable():
        window.started(node)
    window.finished("n1", ok=True)  # n0 is still running: a batch scheduler would wait for it
    assert window.startable() == ["n2"]


def test_failures_past_the_threshold_stop_new_starts() -> None:
    window = RollingWindow(["a", "b", "c", "d"], max_unavailable=2, canary=0, max_failures=0)
    for node in window.startable():
        window.started(node)
    window.finished("a", ok=False)
    assert window.stopped and window.startable() == []
    window.finished("b", ok=True)
    assert window.done and window.pending == ["c", "d"]


def test_a_failed_canary_stops_the_run() -> None:
    window = RollingWindow(["a", "b", "c"], max_unavailable=2, canary=1)
    window.started("a")
    window.finished("a", ok=False)
    assert window.startable() == [] and window.done


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(1, 300),
    k=st.integers(1, 40),
    canary=st.integers(0, 3),
    seed=st.integers(0, 10**6),
    fail_rate=st.floats(0, 0.2),
    max_failures=st.integers(0, 5),
)
def test_simulation_never_exceeds_the_bound(
    nodes: int, k: int, canary: int, seed: int, fail_rate: float, max_failures: int
) -> None:
    rng = random.Random(seed)
    durations = dict(zip([f"n{i}" for i in range(nodes)], draw_durations(nodes, seed), strict=True))
    failing = {n for n in durations if rng.random() < fail_rate}
    window = RollingWindow(list(durations), max_unavailable=k, canary=canary, max_failures=max_failures)
    result = simulate(window, durations.__getitem__, lambda n: n in failing)
    assert result.peak_unavailable <= k
    assert result.succeeded + result.failed + len(window.pending) == nodes
    if len(window.failed) <= max_failures and len(window.failed) < k:
        # Nothing left undone unless the run stopped, or failed nodes (still drained) filled the window.
        assert not window.pending


def test_thousand_nodes_near_the_optimum_and_ahead_of_fixed_batches(record_property: Callable[..., None]) -> None:
    durations = draw_durations(1000, seed=7)
    window = RollingWindow([f"n{i}" for i in range(1000)], max_unavailable=10, canary=1)
    result = simulate(window, lambda n: durations[int(n[1:])])
    mean = sum(durations) / len(durations)
    # Reported in the JUnit XML (pytest --junitxml): simulated time, not wall time.
    record_property("makespan_vs_optimum", round(result.makespan / optimum(1000, 10, mean), 3))
    record_property("fixed_batches_vs_sliding", round(fixed_batches(durations, 10) / result.makespan, 3))
    assert result.peak_unavailable == 10
    assert result.makespan <= 1.1 * optimum(1000, 10, mean)
    assert result.makespan < fixed_batches(durations, 10)


def test_journal_replays_latest_states_and_survives_a_torn_line(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j" / "upgrade.jsonl")
    journal.record("gpu01", State.DRAINING, "535.261.03")
    journal.record("gpu01", State.RESUMED, "535.261.03")
    journal.record("gpu02", State.DRAINED, "535.261.03")
    journal.record("gpu03", State.FAILED, "535.261.03", "kernel gate: 6.12.95+deb12-rt-amd64 not built")
    with journal.path.open("a") as fh:
        fh.write('{"node": "gpu04", "sta')  # killed mid-write
    latest = journal.last_states("535.261.03")
    assert {n: e.state for n, e in latest.items()} == {
        "gpu01": State.RESUMED,
        "gpu02": State.DRAINED,
        "gpu03": State.FAILED,
    }
    assert sorted(e.node for e in journal.out_of_service("535.261.03")) == ["gpu02", "gpu03"]
    assert journal.last_states("550.54.15") == {}


def test_window_restores_from_a_journal() -> None:
    window = RollingWindow(["a", "b", "c"], max_unavailable=1, canary=1)
    window.restore(succeeded=["a"], failed=[])
    assert window.startable() == ["b"]


def test_interrupted_nodes_continue_first_and_failed_ones_keep_their_place() -> None:
    window = RollingWindow(["a", "b", "c", "d", "e"], max_unavailable=2, canary=1, max_failures=1)
    window.restore(succeeded=["a"], failed=["b"], in_flight=["d"])
    # b stays drained and d is out already: d continues, nothing new may start.
    assert window.startable() == ["d"]
    window.started("d")
    assert window.out_of_service == 2 and window.startable() == []
    window.finished("d", ok=True)
    assert window.startable() == ["c"]


def test_a_skipped_node_frees_its_place_and_proves_nothing() -> None:
    window = RollingWindow(["a", "b", "c"], max_unavailable=2, canary=1)
    window.started("a")
    window.finished("a", ok=False, skipped=True)  # its drain timed out: resumed untouched
    assert window.width == 1 and window.startable() == ["b"]
    assert window.skipped == ["a"] and window.failed == []


@pytest.mark.parametrize("k", [1, 5, 50])
def test_makespan_bound_holds_for_several_widths(k: int) -> None:
    durations = draw_durations(1000, seed=k)
    window = RollingWindow([str(i) for i in range(1000)], max_unavailable=k, canary=1)
    result = simulate(window, lambda n: durations[int(n)])
    assert result.peak_unavailable <= k
