"""Run the benchmarks: `python -m bench [--quick] [--only NAME ...]`.

Each scenario module in ``bench/`` has ``NAME`` and ``run(ctx)``; rows are printed as they are
measured. A full run (every scenario, full size) writes them to BENCHMARKS.md; a partial or
--quick run writes a report only to an --out named for it, so it never replaces the record.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench.core import Context, write_report

# In the order they run; cheap ones first so a failure shows early.
SCENARIOS: list[str] = [
    "cost",
    "same_fact",
    "redaction",
    "startup",
    "recall",
    # Store scenarios (4-7); dedupe and decay reuse the stores search builds. Dedupe goes
    # first, so every size it compares is as loaded (decay rewrites every row of the 1M
    # store, and its dead rows would weigh on that size alone); decay drops the store.
    "writes",
    "search",
    "dedupe",
    "decay",
    # Live pipeline and bulk import (1-3): workers, broker and a local model server.
    "pipeline_instant",
    "pipeline_slow",
    "pipeline_import",
    # The HTTP service against a raw ASGI handler (a broker and PostgreSQL, no workers).
    "http_intake",
]
# The names the report's rows carry, accepted by --only as well.
ALIASES = {
    "pipe-live": "pipeline_instant",
    "pipe-slow": "pipeline_slow",
    "pipe-import": "pipeline_import",
    "http-intake": "http_intake",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: under 2 minutes")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help=f"scenarios to run, by module or row name: {', '.join([*SCENARIOS, *ALIASES])}",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="report file (default: BENCHMARKS.md, for a full run only)",
    )
    parser.add_argument("--no-report", action="store_true", help="print only")
    args = parser.parse_args(argv)
    names = [ALIASES.get(name, name) for name in args.only or SCENARIOS]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        known = ", ".join([*SCENARIOS, *ALIASES])
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {known}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gleaner-bench-") as tmp:
        ctx = Context(quick=args.quick, workdir=Path(tmp))
        for name in names:
            print(f"== {name}", flush=True)
            module = importlib.import_module(f"bench.{name}")
            module.run(ctx)
    seconds = time.perf_counter() - started
    command = "python -m bench" + (" --quick" if args.quick else "")
    full = not args.quick and args.only is None
    out = args.out or ("BENCHMARKS.md" if full else None)
    if out and not args.no_report:
        write_report(Path(out), ctx.rows, command, seconds)
    missed = [r for r in ctx.rows if r.met is False]
    print(f"done in {seconds:.0f} s; {len(missed)} target(s) missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
