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


def test_a_new_report_keeps_the_sections_written_under_the_old_one(tmp_path: Path) -> None:
    from bench.core import Row, write_report

    path = tmp_path / "BENCHMARKS.md"
    row = Row("cost", "fixed prompt", 500.0, "tok", note="how it was counted")
    write_report(path, [row], "python -m bench", 1.0)
    old = path.read_text()
    assert "## Notes" in old and "how it was counted" in old
    history = "## Reruns after `abc1234`\n\nThree runs, alternating.\n\n## Later\n\nMore.\n"
    path.write_text(old + "\n" + history)
    write_report(path, [Row("cost", "fixed prompt", 480.0, "tok")], "python -m bench", 2.0)
    new = path.read_text()
    assert "| 480.000 tok |" in new and "| 500.000 tok |" not in new
    assert "how it was counted" not in new  # the old run's generated notes go with it
    assert new.endswith("\n\n" + history)
