"""``Store``: the public entry point. Each call is one transaction on its own session."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING

from gleaner.store.db import migrate
from gleaner.store.errors import NotFound
from gleaner.store.schemas import (
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
from gleaner.store.sessions import Sessions

if TYPE_CHECKING:
    from gleaner.store.housekeeping.decay import DecayResult
    from gleaner.store.housekeeping.dedupe_run import DedupeResult
    from gleaner.store.jobs.status import JobStatus
    from gleaner.store.keys import ApiKey
    from gleaner.store.owners.export import ExportCounts
    from gleaner.store.owners.restore import RestoreResult
    from gleaner.store.recall.search_index import ReindexResult

# Each method imports the module it calls when first called, so a command pays at start-up
# only for what it uses (`gleaner search` never loads the write path, links or keys). The
# reads of the memories table alone (search, list_notes, index_text, fingerprint) run on a
# Core connection: the read commands never import the ORM (tests/test_startup_imports.py).


# What a harvest job runs: imported by ``warm_up`` before a worker's pool forks.
WARMED_MODULES = (
    "gleaner.store.jobs.queue",
    "gleaner.store.jobs.locks",
    "gleaner.store.jobs.ledger",
    "gleaner.store.owners.forget",
    "gleaner.store.notes.similar",
    "gleaner.store.notes.writer",
)


class Store(Sessions):
    """The note store on one database (PostgreSQL or SQLite).

    ``Store()`` opens the database named by the settings; nothing connects until the first
    call. Call ``migrate()`` once (``gleaner db upgrade``) before use.
    """

    def migrate(self, *, progress: Callable[[int], None] | None = None) -> None:
        """Bring the schema to the newest Alembic revision, then put every note not in the
        search index yet into it (``reindex``)."""
        with self._failures():
            migrate(self.engine)
        self.reindex(progress=progress)

    def ensure_schema(self) -> str | None:
        """Migrate a SQLite file whose schema is missing or older (the revision it now has),
        None when it was current; StorageFailure ``not_migrated`` on PostgreSQL behind, so
        ``gleaner db upgrade`` stays an operator's step there (``store.schema.schema_version``)."""
        from gleaner.store.schema.schema_version import ensure_schema

        with self._failures():
            return ensure_schema(self.engine, self.migrate)

    def reindex(self, *, progress: Callable[[int], None] | None = None) -> ReindexResult:
        """Index the notes the search index lacks, rebuilding it whole when it was built by
        another tokenizer version (``store.recall.search_index``); ``progress`` gets the count so
        far after each batch."""
        from gleaner.store.recall.search_index import reindex

        with self._failures():
            return reindex(self.connection, progress=progress)

    def warm_up(self) -> None:
        """Do once what a process would otherwise do on its first harvest job: import the
        modules a job runs and configure the ORM's mappers. A worker calls it before its
        pool forks, so each child inherits the work. Connects to nothing."""
        from importlib import import_module

        from sqlalchemy.orm import configure_mappers

        for module in WARMED_MODULES:
            import_module(module)
        configure_mappers()

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
        from gleaner.store.notes.notes import write as write_note

        result = self._run(
            write_note,
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
        from gleaner.store.notes.notes import get as get_note

        return self._run(get_note, scope, slug)

    def read(self, scope: Scope | tuple[str, str], slug: str) -> NoteWithLinks:
        """The note with links, backlinks and superseder; NotFound when there is none."""
        from gleaner.store.notes.links import read as read_note

        return self._run(read_note, scope, slug)

    def history(self, scope: Scope | tuple[str, str], slug: str) -> list[NoteVersion]:
        """The note's earlier texts, newest first, each with when, why and by whom it was
        replaced; NotFound when there is no such note."""
        from gleaner.store.notes.history import history

        return self._run(history, scope, slug)

    def list_notes(
        self,
        scope: Scope | tuple[str, str],
        *,
        status: str | None = "live",
        pinned: bool | None = None,
        limit: int = 100,
    ) -> list[Note]:
        """The scope's notes, most recently changed first (see ``store.notes.tending``)."""
        from gleaner.store.notes.tending import list_notes

        return self._read(list_notes, scope, status=status, pinned=pinned, limit=limit)

    def pin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Pin a live note by a person's choice: its body goes into the index text."""
        from gleaner.store.notes.tending import set_pinned

        return self._run(set_pinned, scope, slug, True)

    def unpin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Unpin a note."""
        from gleaner.store.notes.tending import set_pinned

        return self._run(set_pinned, scope, slug, False)

    def archive(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Archive a note: out of search and the index, its row and history kept."""
        from gleaner.store.notes.tending import archive

        return self._run(archive, scope, slug)

    def link(
        self, scope: Scope | tuple[str, str], from_slug: str, to_slug: str, rel: str
    ) -> LinkResult:
        """Add a ``related``/``derived_from``/``supersedes`` edge (idempotent)."""
        from gleaner.store.notes.links import link

        return self._run(link, scope, from_slug, to_slug, rel)

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
        ``store.recall.search``), said within ``[since, until)`` when given; with the query's
        ``vector`` of ``vector_model``, fused with the notes' vectors' ranking."""
        from gleaner.store.recall.search import search

        return self._read(
            search,
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
        from gleaner.store.recall.index import fingerprint

        return self._read(fingerprint, scope)

    def index_text(
        self,
        scope: Scope | tuple[str, str],
        query: str | None = None,
        *,
        vector: Sequence[float] | None = None,
        vector_model: str | None = None,
    ) -> str:
        """The compact memory index for a system prompt (see ``store.recall.index``): pinned notes,
        with a ``query`` (the conversation so far) the notes most relevant to it (by hybrid
        search given the query's ``vector``), then other titles, within
        ``index_token_budget``."""
        from gleaner.store.recall.index import index_text

        return self._read(
            index_text,
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
        from gleaner.store.notes.mem import mem_save

        result = self._run(
            mem_save,
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
        from gleaner.store.notes.mem import mem_session_summary

        return self._run(mem_session_summary, self.settings, user_id, content, title=title)

    def job(self, job_id: str) -> JobStatus | None:
        """The job's state, outcome and cost (no transcript), or None when there is none."""
        from gleaner.store.jobs.status import job_status

        return self._run(job_status, job_id)

    def create_api_key(self, owner: str | None, *, read_only: bool = False) -> tuple[ApiKey, str]:
        """A new API key allowed ``owner`` (None: every owner) and its token, which is shown
        only now: the store keeps its sha256. A ``read_only`` key cannot submit, pin,
        delete or forget."""
        from gleaner.store.keys import create_key

        return self._run(create_key, owner, read_only=read_only)

    def api_keys(self) -> list[ApiKey]:
        """Every API key (never a token), oldest first."""
        from gleaner.store.keys import list_keys

        return self._run(list_keys)

    def revoke_api_key(self, key_id: str) -> ApiKey:
        """Delete the key with this id; InvalidInput (``unknown_key``) when there is none."""
        from gleaner.store.keys import revoke_key

        return self._run(revoke_key, key_id)

    def verify_api_key(self, token: str) -> ApiKey | None:
        """The key a token is, or None when it is no live key."""
        from gleaner.store.keys import verify_key

        # One read on every request of the HTTP service: on PostgreSQL it needs no BEGIN
        # and COMMIT round trips of its own (``statements``).
        with self.statements() as session:
            return verify_key(session, token)

    def forget_owner(self, principal: str, *, tombstones: bool = True) -> dict[str, int]:
        """Delete everything stored for an owner (see ``store.owners.forget``); with ``tombstones``
        its harvested transcripts, harvested again, write nothing."""
        from gleaner.store.owners.forget import (  # rare: not paid by every command's start-up
            VACUUMED,
            forget_owner,
        )

        counts = self._run(forget_owner, principal, tombstones=tombstones)
        self._scrub_deleted(VACUUMED)
        return counts

    def forget_conversation(self, principal: str, conversation_id: str) -> dict[str, int]:
        """Forget one conversation of an owner (see ``store.owners.forget_conversation``): the notes
        only it supports are deleted, those it changed get the text before it back, its
        history entries, jobs and ledger rows go, and its transcripts leave tombstones.
        Returns the counts (``forget_conversation.RECEIPT``); NotFound, with nothing changed,
        when nothing of the owner names the conversation."""
        from gleaner.store.owners.forget_conversation import VACUUMED, forget_conversation

        counts = self._run(forget_conversation, principal, conversation_id)
        self._scrub_deleted(VACUUMED)
        return counts

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
        from gleaner.store.owners.export import write as write_export

        scope = Scope.owner(owner)
        with self.snapshot() as connection:
            return write_export(connection, scope, out, progress=progress)

    def export_lines(self, owner: str) -> Iterator[bytes]:
        """The owner's export line by line (each ending in ``\n``), the header first, read
        from one snapshot held while the iterator is consumed (closed with it)."""
        scope = Scope.owner(owner)  # a bad owner is refused now, not at the first line
        return self._export_lines(scope)

    def _export_lines(self, scope: Scope) -> Iterator[bytes]:
        from gleaner.store.owners.export import lines as export_lines

        with self.snapshot() as connection:
            yield from export_lines(connection, scope)

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
        ``store.owners.restore``). Raises ``BadExport`` naming a bad line, ``InvalidInput``
        (``scope_not_empty``, ``bad_owner``)."""
        from gleaner.store.owners.restore import restore

        result = restore(
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
        from gleaner.store.housekeeping.decay import decay

        return decay(self.transaction, self.settings, dry_run=dry_run)

    def dedupe(self, *, dry_run: bool = False) -> DedupeResult:
        """Supersede near-duplicate notes changed since the last run; ``locked`` if one runs."""
        from gleaner.store.housekeeping.dedupe import dedupe

        return self._run(dedupe, self.settings, dry_run=dry_run)


__all__ = ["NotFound", "Store"]
