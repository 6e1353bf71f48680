"""``Store``: the public entry point. Each call is one transaction on its own session."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, Executable
from sqlalchemy.exc import DataError, DBAPIError, SQLAlchemyError, StatementError

from store.db import make_engine, migrate
from store.errors import DataRefused, NotFound, StorageFailure, StoreError
from store.freshness import Freshness
from store.schemas import (
    LinkResult,
    Note,
    NoteChange,
    NoteVersion,
    NoteWithLinks,
    SaveResult,
    Scope,
    SearchHit,
    WriteResult,
)
from store.settings import Settings, load_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from store import job_status, keys
    from store.decay import DecayResult
    from store.dedupe import DedupeResult
    from store.export import ExportCounts
    from store.locks import TranscriptLock
    from store.restore import RestoreResult
    from store.search_index import ReindexResult

# Each method imports the module it calls when first called, so a command pays at start-up
# only for what it uses (`gleaner search` never loads the write path, links or keys). The
# reads of the memories table alone (search, list_notes, index_text, fingerprint) run on a
# Core connection: the read commands never import the ORM (tests/test_startup_imports.py).

T = TypeVar("T")


class Store:
    """The note store on one database (PostgreSQL or SQLite).

    ``Store()`` opens the database named by the settings; nothing connects until the first
    call. Call ``migrate()`` once (``gleaner db upgrade``) before use.
    """

    def __init__(self, database_url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.database_url = database_url or self.settings.database_url
        self.engine: Engine = make_engine(self.database_url, pool_size=self.settings.db_pool_size)
        self._sessionmaker: sessionmaker[Session] | None = None
        self._autocommit_engine: Engine | None = None
        # Every committed write counts here: it keeps the planner's statistics fresh.
        self.freshness = Freshness(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def migrate(self, *, progress: Callable[[int], None] | None = None) -> None:
        """Bring the schema to the newest Alembic revision, then put every note not in the
        search index yet into it (``reindex``)."""
        with self._failures():
            migrate(self.engine)
        self.reindex(progress=progress)

    def ensure_schema(self) -> str | None:
        """Migrate a SQLite file whose schema is missing or older (the revision it now has),
        None when it was current; StorageFailure ``not_migrated`` on PostgreSQL behind, so
        ``gleaner db upgrade`` stays an operator's step there (``store.schema_version``)."""
        from store import schema_version

        with self._failures():
            return schema_version.ensure_schema(self)

    def reindex(self, *, progress: Callable[[int], None] | None = None) -> ReindexResult:
        """Index the notes the search index lacks, rebuilding it whole when it was built by
        another tokenizer version (``store.search_index``); ``progress`` gets the count so
        far after each batch."""
        from store import search_index

        with self._failures():
            return search_index.reindex(self.connection, progress=progress)

    def dispose(self) -> None:
        """Close the pooled connections and the transcript locks' own connection, which
        releases any lock still held (the store opens new ones if used again)."""
        locks = sys.modules.get("store.locks")  # not imported: no lock connection was opened
        if locks is not None:
            locks.close_for(self.engine)
        self.engine.dispose()

    def warm_up(self) -> None:
        """Do once what a process would otherwise do on its first harvest job: import the
        modules a job runs and configure the ORM's mappers. A worker calls it before its
        pool forks, so each child inherits the work. Connects to nothing."""
        from sqlalchemy.orm import configure_mappers

        from store import forget, jobs, ledger, locks, similar, writer  # noqa: F401

        configure_mappers()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on any error."""
        if self._sessionmaker is None:
            from sqlalchemy.orm import sessionmaker  # the ORM: only for what needs it

            self._sessionmaker = sessionmaker(self.engine, expire_on_commit=False)
        with self._failures(), self._sessionmaker() as session, session.begin():
            yield session

    @contextmanager
    def statements(self) -> Iterator[Connection]:
        """A Core connection whose statements each commit on their own (PostgreSQL
        autocommit), for steps whose every write is one Core statement atomic by itself: it
        spares a BEGIN and a COMMIT round trip, and an ORM session's bookkeeping (about half
        a million instructions a use, measured: a harvest job takes two steps). On SQLite,
        which takes its write lock at BEGIN, the connection is inside one transaction."""
        if self.engine.dialect.name != "postgresql":
            with self._failures(), self.engine.begin() as connection:
                yield connection
            return
        if self._autocommit_engine is None:
            # Setting psycopg's autocommit flag is client-side: no round trip either way.
            self._autocommit_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        with self._failures(), self._autocommit_engine.connect() as connection:
            yield connection

    @contextmanager
    def connection(
        self, *, opening: Sequence[tuple[Executable, Mapping[str, Any]]] | None = None
    ) -> Iterator[Connection]:
        """A Core connection inside one transaction (as ``transaction``, without the ORM):
        committed on success, rolled back on any error.

        ``opening`` are statements to run first (a lock, say), each with its parameters.
        """
        with self._failures(), self.engine.begin() as connection:
            for statement, params in opening or ():
                connection.execute(statement, params)
            yield connection

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A Core connection that only reads, inside one transaction seeing one consistent
        snapshot, for a long read (an export) that must not hold writers up: on PostgreSQL
        REPEATABLE READ, READ ONLY; on SQLite a deferred transaction (in WAL mode a
        reader's snapshot, which takes no write lock)."""
        from store.db import READ_SNAPSHOT

        with self._failures(), self.engine.connect() as connection:
            if self.dialect == "postgresql":
                connection.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            else:
                connection.execution_options(**{READ_SNAPSHOT: True})
            with connection.begin():
                yield connection

    def transcript_lock(self, scope: Scope, digest: str) -> TranscriptLock:
        """This process's advisory lock on one transcript (its redacted hash) in ``scope``,
        not taken yet (see ``store.locks``): held on a dedicated connection, never a pooled
        one, so it may be held across a model call."""
        from store.locks import transcript_lock

        return transcript_lock(self.engine, scope, digest)

    @contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (DBAPIError, SQLAlchemyError) as exc:
            if isinstance(exc, StatementError):
                # The engine hides them from the message, but the error still holds the
                # statement's parameters: a transcript's or a note's words.
                exc.params = None
            raise _storage_failure(exc) from exc

    def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        with self.transaction() as session:
            return fn(session, *args, **kwargs)

    def _read(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        with self.connection() as connection:
            return fn(connection, *args, **kwargs)

    def write(
        self,
        scope: Scope | tuple[str, str],
        attrs: Mapping[str, object],
        *,
        conversation_id: str | None = None,
        provenance: str | None = None,
        allow_pin_untrusted: bool = False,
    ) -> WriteResult:
        """Validate and write a note; see the rules in README ("The store")."""
        from store import notes

        result = self._run(
            notes.write,
            self.settings,
            scope,
            attrs,
            conversation_id=conversation_id,
            provenance=provenance,
            allow_pin_untrusted=allow_pin_untrusted,
        )
        self.freshness.wrote(1)
        return result

    def get(self, scope: Scope | tuple[str, str], slug: str) -> Note | None:
        """The note with ``slug`` in the scope, or None."""
        from store import notes

        return self._run(notes.get, scope, slug)

    def read(self, scope: Scope | tuple[str, str], slug: str) -> NoteWithLinks:
        """The note with links, backlinks and superseder; NotFound when there is none."""
        from store import links

        return self._run(links.read, scope, slug)

    def history(self, scope: Scope | tuple[str, str], slug: str) -> list[NoteVersion]:
        """The note's earlier texts, newest first, each with when, why and by whom it was
        replaced; NotFound when there is no such note."""
        from store import history

        return self._run(history.history, scope, slug)

    def list_notes(
        self,
        scope: Scope | tuple[str, str],
        *,
        status: str | None = "live",
        pinned: bool | None = None,
        limit: int = 100,
    ) -> list[Note]:
        """The scope's notes, most recently changed first (see ``store.tending``)."""
        from store import tending

        return self._read(tending.list_notes, scope, status=status, pinned=pinned, limit=limit)

    def pin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Pin a live note by a person's choice: its body goes into the index text."""
        from store import tending

        return self._run(tending.set_pinned, scope, slug, True)

    def unpin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Unpin a note."""
        from store import tending

        return self._run(tending.set_pinned, scope, slug, False)

    def archive(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Archive a note: out of search and the index, its row and history kept."""
        from store import tending

        return self._run(tending.archive, scope, slug)

    def link(
        self, scope: Scope | tuple[str, str], from_slug: str, to_slug: str, rel: str
    ) -> LinkResult:
        """Add a ``related``/``derived_from``/``supersedes`` edge (idempotent)."""
        from store import links

        return self._run(links.link, scope, from_slug, to_slug, rel)

    def search(
        self,
        scope: Scope | tuple[str, str],
        query: str,
        limit: int = 10,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        vector: Sequence[float] | None = None,
        vector_model: str | None = None,
    ) -> list[SearchHit]:
        """Ranked any-word search over the scope's live notes (BM25, recency, pinning: see
        ``store.search``), said within ``[since, until)`` when given; with the query's
        ``vector`` of ``vector_model``, fused with the notes' vectors' ranking."""
        from store import search

        return self._read(
            search.search,
            self.settings,
            scope,
            query,
            limit,
            since=since,
            until=until,
            vector=vector,
            vector_model=vector_model,
        )

    def fingerprint(self, scope: Scope | tuple[str, str]) -> tuple[int, int]:
        """``(live note count, max updated_seq)`` of the scope."""
        from store import index

        return self._read(index.fingerprint, scope)

    def index_text(
        self,
        scope: Scope | tuple[str, str],
        query: str | None = None,
        *,
        vector: Sequence[float] | None = None,
        vector_model: str | None = None,
    ) -> str:
        """The compact memory index for a system prompt (see ``store.index``): pinned notes,
        with a ``query`` (the conversation so far) the notes most relevant to it (by hybrid
        search given the query's ``vector``), then other titles, within
        ``index_token_budget``."""
        from store import index

        return self._read(
            index.index_text,
            scope,
            token_budget=self.settings.index_token_budget,
            pinned_body_bytes=self.settings.pinned_body_bytes,
            query=query,
            settings=self.settings,
            vector=vector,
            vector_model=vector_model,
        )

    def mem_save(
        self,
        user_id: str,
        content: str,
        *,
        type: str,
        title: str,
        topic_key: str | None = None,
    ) -> SaveResult:
        """Save an observation. ValueError for bad input, RuntimeError for storage failure."""
        from store import mem

        result = self._run(
            mem.mem_save,
            self.settings,
            user_id,
            content,
            type=type,
            title=title,
            topic_key=topic_key,
        )
        self.freshness.wrote(1)
        return result

    def mem_session_summary(
        self, user_id: str, content: str, *, title: str = "Session summary"
    ) -> SaveResult:
        """Save the active session's summary and end the session."""
        from store import mem

        return self._run(mem.mem_session_summary, self.settings, user_id, content, title=title)

    def job(self, job_id: str) -> job_status.JobStatus | None:
        """The job's state, outcome and cost (no transcript), or None when there is none."""
        from store import job_status

        return self._run(job_status.job_status, job_id)

    def create_api_key(
        self, owner: str | None, *, read_only: bool = False
    ) -> tuple[keys.ApiKey, str]:
        """A new API key allowed ``owner`` (None: every owner) and its token, which is shown
        only now: the store keeps its sha256. A ``read_only`` key cannot submit, pin,
        delete or forget."""
        from store import keys

        return self._run(keys.create_key, owner, read_only=read_only)

    def api_keys(self) -> list[keys.ApiKey]:
        """Every API key (never a token), oldest first."""
        from store import keys

        return self._run(keys.list_keys)

    def revoke_api_key(self, key_id: str) -> keys.ApiKey:
        """Delete the key with this id; InvalidInput (``unknown_key``) when there is none."""
        from store import keys

        return self._run(keys.revoke_key, key_id)

    def verify_api_key(self, token: str) -> keys.ApiKey | None:
        """The key a token is, or None when it is no live key."""
        from store import keys

        # One read on every request of the HTTP service: on PostgreSQL it needs no BEGIN
        # and COMMIT round trips of its own (``statements``).
        with self.statements() as session:
            return keys.verify_key(session, token)

    def forget_owner(self, principal: str, *, tombstones: bool = True) -> dict[str, int]:
        """Delete everything stored for an owner (see ``store.forget``); with ``tombstones``
        its harvested transcripts, harvested again, write nothing."""
        from store import forget  # rare: not paid by every command's start-up

        counts = self._run(forget.forget_owner, principal, tombstones=tombstones)
        self._scrub_deleted(forget.VACUUMED)
        return counts

    def forget_conversation(self, principal: str, conversation_id: str) -> dict[str, int]:
        """Forget one conversation of an owner (see ``store.forget_conversation``): the notes
        only it supports are deleted, those it changed get the text before it back, its
        history entries, jobs and ledger rows go, and its transcripts leave tombstones.
        Returns the counts (``forget_conversation.RECEIPT``); NotFound, with nothing changed,
        when nothing of the owner names the conversation."""
        from store import forget_conversation

        counts = self._run(forget_conversation.forget_conversation, principal, conversation_id)
        self._scrub_deleted(forget_conversation.VACUUMED)
        return counts

    def _scrub_deleted(self, tables: Sequence[str]) -> None:
        """After a forget's commit: rid the files of the deleted rows' bytes (PostgreSQL:
        vacuum ``tables``; SQLite: empty the write-ahead log)."""
        if self.dialect == "postgresql":
            # Deleted rows stay in the table files until vacuumed: do it now, not some day.
            with self._failures(), self.engine.connect() as conn:
                autocommit = conn.execution_options(isolation_level="AUTOCOMMIT")
                autocommit.exec_driver_sql(f"VACUUM {', '.join(tables)}")
        elif self.dialect == "sqlite":
            # The write-ahead log still holds the pages as they were before the delete. A
            # checkpoint cannot run inside a transaction, so not through a Connection (whose
            # first statement begins one here: ``store.db``).
            with self._failures():
                raw = self.engine.raw_connection()
                try:
                    raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    raw.close()

    def export_owner(
        self,
        owner: str,
        out: IO[bytes] | IO[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> ExportCounts:
        """Write the owner's notes, history and links to ``out`` as JSON Lines (docs/EXPORT.md),
        read from one snapshot without holding writers up; ``progress`` gets ``(records
        written, records in all)`` as it goes. Returns the header's counts."""
        from store import export

        scope = Scope.owner(owner)
        with self.snapshot() as connection:
            return export.write(connection, scope, out, progress=progress)

    def export_lines(self, owner: str) -> Iterator[bytes]:
        """The owner's export line by line (each ending in ``\n``), the header first, read
        from one snapshot held while the iterator is consumed (closed with it)."""
        scope = Scope.owner(owner)  # a bad owner is refused now, not at the first line
        return self._export_lines(scope)

    def _export_lines(self, scope: Scope) -> Iterator[bytes]:
        from store import export

        with self.snapshot() as connection:
            yield from export.lines(connection, scope)

    def restore(
        self,
        fp: IO[bytes] | IO[str],
        owner: str | None = None,
        *,
        reassign_owner: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> RestoreResult:
        """Restore an export (a file object, binary or text) into its owner, which must hold
        no note; ``owner`` another than the file's needs ``reassign_owner``. Every line is
        checked before anything is written, then all is written in one transaction (see
        ``store.restore``). Raises ``BadExport`` naming a bad line, ``InvalidInput``
        (``scope_not_empty``, ``bad_owner``)."""
        from store import restore

        result = restore.restore(
            self.connection,
            self.settings,
            fp,
            owner=owner,
            reassign_owner=reassign_owner,
            progress=progress,
        )
        self.freshness.wrote(result.notes)
        return result

    def decay(self, *, dry_run: bool = False) -> DecayResult:
        """Bring every note's recency weight up to date, in short batches (archiving if set)."""
        from store import decay

        return decay.decay(self.transaction, self.settings, dry_run=dry_run)

    def dedupe(self, *, dry_run: bool = False) -> DedupeResult:
        """Supersede near-duplicate notes changed since the last run; ``locked`` if one runs."""
        from store import dedupe

        return self._run(dedupe.dedupe, self.settings, dry_run=dry_run)


_SCHEMA_MISSING = ("no such table", "no such column", "does not exist")


# PostgreSQL refuses the connection itself when the URL names a database or role it does not
# have; no SQLSTATE reaches the client then, only this text.
_NO_DATABASE = re.compile(r'FATAL:\s+(database|role) "([^"]*)" does not exist')


def _storage_failure(exc: SQLAlchemyError) -> StorageFailure:
    """Say what went wrong in one line, and what to do when the database, the role or the
    schema is missing."""
    detail = str(exc.orig if isinstance(exc, DBAPIError) else exc).strip().splitlines()[0]
    missing = _NO_DATABASE.search(detail)
    if missing:
        kind, name = missing.groups()
        fix = f"createdb {name}" if kind == "database" else f"createuser {name}"
        return StorageFailure(
            f'the server has no {kind} "{name}" (GLEANER_DATABASE_URL): create it ({fix}) '
            "or fix the URL, then run `gleaner db upgrade`",
            reason="no_database",
        )
    if any(marker in detail for marker in _SCHEMA_MISSING):
        return StorageFailure(
            f"the database schema is missing or older than this Gleaner ({detail}): "
            "run `gleaner db upgrade`",
            reason="not_migrated",
        )
    if isinstance(exc, DataError):
        return DataRefused(f"the database refused a value: {detail}")
    if "connection failed" in detail or "could not connect" in detail:
        return StorageFailure(
            f"database error: {detail}: is PostgreSQL running and reachable there? Start it, "
            "or fix the host and port in GLEANER_DATABASE_URL"
        )
    return StorageFailure(f"database error: {detail}")


__all__ = ["NotFound", "Store"]
