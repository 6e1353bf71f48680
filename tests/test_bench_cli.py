"""``python -m bench``: a partial or quick run never replaces the full run's BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import main


@pytest.mark.slow
def test_a_partial_run_writes_only_where_it_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--quick", "--only", "cost"]) == 0
    assert not (tmp_path / "BENCHMARKS.md").exists()
    assert main(["--quick", "--only", "cost", "--out", "partial.md"]) == 0
    report = (tmp_path / "partial.md").read_text()
    assert "python -m bench --quick" in report and "| cost |" in report
