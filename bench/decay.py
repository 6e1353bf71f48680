"""Scenario 7: decay over the large store, with single writes going on beside it.

``store.housekeeping.decay.decay`` runs through a transaction factory that times each batch (one
short
transaction each). A writer thread with its own engine calls ``Store.write`` in a loop for the
whole run, alternately adding a note and rewriting a random existing note (an explicit-slug
upsert, so it needs the row lock a decay batch may hold); its latencies are compared with the
same writer running alone just before.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from bench import data
from bench.core import Context, Row, percentile
from gleaner.store import Scope, Store
from gleaner.store.housekeeping import decay

NAME = "decay"


def writer(
    url: str, notes: list[data.NoteRow], stop: threading.Event, latencies: list[float]
) -> None:
    store = Store(url, settings=data.bench_settings())
    rng = random.Random(11)
    n = 0
    while not stop.is_set():
        n += 1
        started = time.perf_counter()
        if n % 2:
            store.write(Scope.owner("decay-writer"), {"title": f"Live note {n}", "body": "new"})
        else:
            old = rng.choice(notes)
            store.write(
                Scope.owner(old.scope), {"title": old.title, "body": "rewritten", "slug": old.slug}
            )
        latencies.append((time.perf_counter() - started) * 1000)
    store.dispose()


def run(ctx: Context) -> None:
    n = ctx.size(1_000_000, 10_000)
    url, dataset, _ = data.store_for(ctx, "postgresql", n)
    store = Store(url, settings=data.bench_settings())
    alone: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(url, dataset.notes, stop, alone))
    thread.start()
    time.sleep(ctx.size(5, 1))
    stop.set()
    thread.join()

    batches: list[float] = []

    @contextmanager
    def timed_transaction() -> Iterator[Session]:
        started = time.perf_counter()
        with store.transaction() as session:
            yield session
        batches.append((time.perf_counter() - started) * 1000)

    during: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(url, dataset.notes, stop, during))
    thread.start()
    started = time.perf_counter()
    result = decay.decay(timed_transaction, store.settings)
    seconds = time.perf_counter() - started
    stop.set()
    thread.join()
    store.dispose()

    ctx.add(
        Row(
            NAME,
            f"pg {n // 1000}k notes: decay time",
            seconds,
            "s",
            note=f"{result.updated} rows updated in {result.batches} batches of "
            f"{store.settings.housekeeping_batch_size}",
        )
    )
    ctx.add(Row(NAME, f"pg {n // 1000}k notes: decay rate", n / seconds, "rows/s"))
    ctx.add(
        Row(
            NAME,
            "longest decay transaction",
            max(batches),
            "ms",
            note="each batch is one transaction: no lock is held longer than this",
        )
    )
    ctx.add(
        Row(NAME, "writes alone: p99", percentile(alone, 99), "ms", note=f"{len(alone)} writes")
    )
    p99 = percentile(during, 99)
    ctx.add(
        Row(
            NAME,
            "writes during decay: p99",
            p99,
            "ms",
            ceiling=percentile(alone, 99),
            target="writes go on; p99 <= longest batch",
            met=bool(during) and p99 <= max(batches),
            note=f"{len(during)} writes ({len(during) / seconds:.0f}/s) during decay; "
            f"max {max(during, default=0):.1f} ms",
        )
    )
    data.forget("postgresql", n)  # the last scenario on this store
