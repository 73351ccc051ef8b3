"""Each file under bad/ must produce exactly the diagnostics in its .expected file, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuinfra.errors import InvalidInput
from gpuinfra.validate.load import load_cluster

BAD = Path(__file__).parent / "bad"
CASES = sorted(p.name for p in BAD.glob("*.yml"))


@pytest.mark.parametrize("name", CASES)
def test_bad_file_reports_exact_errors(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(BAD)  # diagnostics name the file as given, so keep it short and stable
    with pytest.raises(InvalidInput) as caught:
        load_cluster(name)
    got = [str(d) for d in caught.value.diagnostics]
    expected = (BAD / name.replace(".yml", ".expected")).read_text().splitlines()
    assert got == expected


def test_every_case_has_expectations() -> None:
    assert CASES, "no bad files found"
    for name in CASES:
        assert (BAD / name.replace(".yml", ".expected")).exists(), name


def test_errors_point_at_real_lines() -> None:
    for name in CASES:
        lines = (BAD / name).read_bytes().count(b"\n") + 1
        for expected in (BAD / name.replace(".yml", ".expected")).read_text().splitlines():
            line = int(expected.split(":")[1])
            assert 1 <= line <= lines, (name, expected)


def test_unreadable_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read the file"):
        load_cluster(tmp_path / "missing.yml")
    if os.geteuid() != 0:  # root reads anything
        unreadable = tmp_path / "locked.yml"
        unreadable.write_text("name: x\n")
        unreadable.chmod(0)
        with pytest.raises(InvalidInput):
            load_cluster(unreadable)
