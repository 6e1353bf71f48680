"""Scenario 6: dedupe housekeeping at three sizes, with planted near-duplicates.

``Store.dedupe()`` runs in a child process per size (so its peak RSS is its own) on the
synthetic stores of ``bench.data`` (1% planted near-duplicates, 0.5% exact title copies).
Reported: time, notes/s, peak RSS, the scaling exponent between sizes
(log(t2/t1) / log(n2/n1)), and on the smallest set the recall against the exact all-pairs
answer: a pair at or over the threshold is resolved when one of its notes is superseded.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict

from sqlalchemy import create_engine, text

from bench import data
from bench.core import Context, Row
from gleaner.store.notes.terms import FactText, disagreement, similarity_terms

NAME = "dedupe"

CHILD = """
import json, sys, time
from gleaner.store import Store
from bench.data import bench_settings


def hwm_kb():
    # VmHWM (peak RSS) belongs to this process image: unlike ru_maxrss it starts afresh at exec.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


store = Store(sys.argv[1], settings=bench_settings())
store.fingerprint(("owner", "x"))  # connect and import before measuring
before = hwm_kb()
started = time.perf_counter()
result = store.dedupe()
seconds = time.perf_counter() - started
peak = hwm_kb()
print(json.dumps({"seconds": seconds, "rss_before_kb": before, "rss_peak_kb": peak,
                  "scanned": result.notes_scanned, "superseded": result.superseded,
                  "checked": result.candidates_checked}))
"""


def run_child(url: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:  # say why: a bare CalledProcessError hides the child's traceback
        raise RuntimeError(f"dedupe child failed ({out.returncode}): {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def exact_pairs(dataset: data.Dataset, threshold: float) -> set[tuple[int, int]]:
    """Every pair of notes of one scope holding the same fact (``store.notes.terms.same_fact``:
    at or over ``threshold``, nothing contradicting), by brute force."""
    by_scope: defaultdict[str, list[tuple[int, frozenset[str], FactText]]] = defaultdict(list)
    for note in dataset.notes:
        by_scope[note.scope].append(
            (
                note.id,
                similarity_terms(note.title, note.topics),
                FactText(note.title, note.body, note.topics),
            )
        )
    pairs = set()
    for notes in by_scope.values():
        for i, (a, ta, fa) in enumerate(notes):
            for b, tb, fb in notes[i + 1 :]:
                shared = len(ta & tb)
                if (
                    shared
                    and shared / (len(ta) + len(tb) - shared) >= threshold
                    and disagreement(fa, fb) is None
                ):
                    pairs.add((a, b))
    return pairs


def recall(url: str, pairs: set[tuple[int, int]]) -> tuple[float, int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        superseded = set(
            conn.execute(text("SELECT id FROM memories WHERE status = 'superseded'")).scalars()
        )
    engine.dispose()
    resolved = sum(1 for a, b in pairs if a in superseded or b in superseded)
    return (resolved / len(pairs) if pairs else 1.0), len(superseded)


def run(ctx: Context) -> None:
    sizes = [2_000, 10_000] if ctx.quick else [10_000, 100_000, 1_000_000]
    threshold = data.bench_settings().duplicate_threshold
    timings: list[tuple[int, float]] = []
    for n in sizes:
        url, dataset, _ = data.store_for(ctx, "postgresql", n)
        pairs = exact_pairs(dataset, threshold) if n == sizes[0] else None
        got = run_child(url)
        seconds = got["seconds"]
        timings.append((n, seconds))
        target = "<= 20 s" if n >= 1_000_000 else ""
        ctx.add(
            Row(
                NAME,
                f"pg {n // 1000}k notes: time",
                seconds,
                "s",
                target=target,
                met=(seconds <= 20) if target else None,
                note=f"{got['superseded']} superseded, {got['checked']} candidate pairs scored",
            )
        )
        ctx.add(Row(NAME, f"pg {n // 1000}k notes: rate", n / seconds, "notes/s"))
        ctx.add(
            Row(
                NAME,
                f"pg {n // 1000}k notes: peak RSS",
                got["rss_peak_kb"] / 1024,
                "MB",
                note=f"{(got['rss_peak_kb'] - got['rss_before_kb']) / 1024:.0f} MB over the "
                "child's peak before the run (one scope compared, up to 3 read ahead)",
            )
        )
        if pairs is not None:
            share, _ = recall(url, pairs)
            ctx.add(
                Row(
                    NAME,
                    f"pg {n // 1000}k notes: recall vs exact all-pairs",
                    share,
                    "",
                    target="1.0",
                    met=share == 1.0,
                    note=f"{len(pairs)} exact pairs",
                )
            )
        if len(timings) > 1:
            (n1, t1), (n2, t2) = timings[-2], timings[-1]
            exponent = math.log(t2 / t1) / math.log(n2 / n1)
            ctx.add(
                Row(
                    NAME,
                    f"scaling exponent {n1 // 1000}k -> {n2 // 1000}k",
                    exponent,
                    "",
                    target="<= 1.15",
                    met=exponent <= 1.15,
                )
            )
        if n != sizes[-1]:
            data.forget("postgresql", n)  # the largest is decay's next (dropped at exit if not)
