"""Progress on stderr: the rich bar on a terminal, a plain line every few seconds elsewhere
(nohup, CI, ``docker logs``), and following an import's jobs until they finish."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from gleaner.cli.common import Interrupted

if TYPE_CHECKING:
    from gleaner.store import Store

# Seconds between two looks at an import's jobs while following it (``follow_import``).
POLL_SECONDS = 0.5


class ImportStillRunning(Interrupted):
    """Raised when the user stops following an import (Ctrl-C): the workers go on with it."""

    def __init__(self, import_id: str) -> None:
        super().__init__(
            f"stopped following import {import_id}; it goes on in the workers: follow it "
            f"again with `gleaner status --import {import_id} --watch`"
        )
        self.import_id = import_id


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h03m``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Progress:
    """``update(done, total)`` shows how far a run is; use as a context manager.

    On a terminal the rich bar redraws in place. Otherwise a line such as
    ``import 3ef6ebb8: 1200/5000 (24%), 41.2/s, ETA 1m32s`` goes to stderr at the first
    update, then at most every ``every`` seconds (``GLEANER_PROGRESS_SECONDS``), and once
    more at the end, so a log shows the run move and finish.
    The rate counts only what was done while this object watched. With ``quiet_for``, nothing
    shows before the run has gone on that long: a short run prints nothing at all.
    """

    def __init__(
        self,
        label: str,
        *,
        every: float,
        stream: TextIO | None = None,
        from_zero: bool = False,
        quiet_for: float = 0.0,
    ) -> None:
        """``from_zero``: the run starts now with nothing done (an in-process harvest);
        otherwise the rate counts from the first update (an import already under way).
        ``quiet_for``: seconds from now during which updates are only counted, not shown."""
        self.label = label
        self.every = every
        self._quiet_until = time.monotonic() + quiet_for
        self._bar_started = False
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        self._task: Any = None
        self._start: tuple[float, int] | None = (time.monotonic(), 0) if from_zero else None
        self._last_line = float("-inf")
        self._shown: tuple[int, int] | None = None
        self._seen: tuple[int, int] | None = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
            )
            self._task = self._bar.add_task(label, total=None)

    def __enter__(self) -> Progress:
        if self._bar is not None and time.monotonic() >= self._quiet_until:
            self._start_bar()
        return self

    def _start_bar(self) -> None:
        self._bar.start()
        self._bar_started = True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            if self._bar_started:
                self._bar.stop()
        elif self._seen is not None and self._seen != self._shown and not self._quiet():
            self._print(*self._seen)

    def _quiet(self) -> bool:
        """Still quiet: nothing shown yet, and the run has not gone on ``quiet_for`` yet."""
        return self._shown is None and time.monotonic() < self._quiet_until

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = (now, done)
        self._seen = (done, total)
        if self._quiet():
            return
        if self._bar is not None:
            if not self._bar_started:
                self._start_bar()
            self._bar.update(self._task, completed=done, total=total)
            return
        if now - self._last_line >= self.every:
            self._print(done, total)

    def line(self, done: int, total: int) -> str:
        """The plain progress line for ``done`` of ``total``."""
        percent = 100.0 if total == 0 else 100.0 * done / total
        text = f"{self.label}: {done}/{total} ({percent:.0f}%)"
        if self._start is None:
            return text
        started, first = self._start
        elapsed = time.monotonic() - started
        rate = (done - first) / elapsed if elapsed > 0 else 0.0
        if rate <= 0:
            return text + (", done" if done >= total else ", waiting")
        left = "done" if done >= total else f"ETA {duration((total - done) / rate)}"
        return f"{text}, {rate:.1f}/s, {left}"

    def _print(self, done: int, total: int) -> None:
        print(self.line(done, total), file=self.stream, flush=True)
        self._last_line = time.monotonic()
        self._shown = (done, total)


def import_state(store: Store, import_id: str) -> tuple[dict[str, Any], dict[str, int]]:
    """An import's job counts (``store.jobs.reports.import_progress``) and what its finished
    jobs wrote and cost (``harvest.outcome.ImportTotals``); ({}, {}) when there is no such
    import."""
    from gleaner.harvest.outcome import ImportTotals
    from gleaner.store.jobs import reports as job_reports

    with store.transaction() as session:
        state = job_reports.import_progress(session, import_id)
        if not state:
            return {}, {}
        totals = ImportTotals.of(
            job_reports.done_results(session, import_id),
            job_reports.import_usage(session, import_id),
        )
    return state, totals.model_dump()


def follow_import(store: Store, import_id: str, *, poll_seconds: float = POLL_SECONDS) -> None:
    """Show an import's progress, looking every ``poll_seconds``, until every job is done or
    failed. Ctrl-C stops following (ImportStillRunning), never the import."""
    from gleaner.store.jobs import reports as job_reports

    every = store.settings.progress_seconds
    try:
        with Progress(f"import {import_id[:8]}", every=every) as progress:
            while True:
                with store.transaction() as session:
                    state = job_reports.import_progress(session, import_id)
                progress.update(int(state["finished"]), int(state["total"]))
                if state["finished"] >= state["total"]:
                    return
                time.sleep(poll_seconds)
    except KeyboardInterrupt:
        raise ImportStillRunning(import_id) from None
