"""What every scenario shares: the run context, result rows, and the report."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_ADMIN_URL = os.environ.get(
    "GLEANER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GLEANER_BENCH_REDIS_URL", "redis://127.0.0.1:6379")


@dataclass
class Row:
    """One measured figure. ``ratio`` = value / ceiling when a ceiling was measured."""

    scenario: str
    metric: str
    value: float
    unit: str
    ceiling: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.ceiling in (None, 0):
            return None
        return self.value / self.ceiling  # type: ignore[operator]


@dataclass
class Context:
    """Sizes and services for one bench run."""

    quick: bool
    workdir: Path
    rows: list[Row] = field(default_factory=list)

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        flag = "" if row.met is None else ("  met" if row.met else "  MISSED")
        ratio = "" if row.ratio is None else f"  ratio {row.ratio:.2f}"
        print(f"  {row.scenario:<10} {row.metric:<48} {row.value:>12.3f} {row.unit}{ratio}{flag}")
        return row

    def fresh_pg(self, name: str) -> str:
        """A new, empty PostgreSQL database; returns its URL."""
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)

    def redis_url(self, db: int = 14) -> str:
        return f"{REDIS_URL}/{db}"


@contextmanager
def timed() -> Iterator[Callable[[], float]]:
    """``with timed() as elapsed: ...`` then ``elapsed()`` is the block's seconds."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pg = subprocess.run(["psql", "--version"], capture_output=True, text=True, check=False)
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}, {pg.stdout.strip() or 'psql ?'}"
    )


def written_by_hand(report: str) -> str:
    """The sections of a report after the generated ones (the comparisons and reruns people
    wrote under it): from its first ``## `` heading other than ``## Notes``."""
    lines = report.splitlines()
    for number, line in enumerate(lines):
        if line.startswith("## ") and line.strip() != "## Notes":
            return "\n".join(lines[number:]) + "\n"
    return ""


def write_report(path: Path, rows: list[Row], command: str, seconds: float) -> None:
    """BENCHMARKS.md: the machine, the command, and every row of this run, then the sections
    written by hand under the report it replaces, kept as they were."""
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{command}` — took {seconds:.0f} s on {time.strftime('%Y-%m-%d')}.",
        f"Machine: {machine()}.",
        "",
        "Every ratio is against a ceiling measured in the same run on the same machine.",
        "",
        "| scenario | metric | value | ceiling | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ceiling = "" if r.ceiling is None else f"{r.ceiling:.3f}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(
            f"| {r.scenario} | {r.metric} | {r.value:.3f} {r.unit} | {ceiling} | {ratio} | "
            f"{r.target} | {met} |"
        )
    notes = [f"- {r.scenario} / {r.metric}: {r.note}" for r in rows if r.note]
    if notes:
        lines += ["", "## Notes", "", *notes]
    kept = written_by_hand(path.read_text()) if path.exists() else ""
    path.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
