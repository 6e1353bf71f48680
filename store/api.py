"""``Store``: the public entry point. Each call is one transaction on its own session."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING

from store.db import migrate
from store.errors import NotFound
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
from store.sessions import Sessions

if TYPE_CHECKING:
    from store.decay import DecayResult
    from store.dedupe_run import DedupeResult
    from store.export import ExportCounts
    from store.job_status import JobStatus
    from store.keys import ApiKey
    from store.restore import RestoreResult
    from store.search_index import ReindexResult

# Each method imports the module it calls when first called, so a command pays at start-up
# only for what it uses (`gleaner search` never loads the write path, links or keys). The
# reads of the memories table alone (search, list_notes, index_text, fingerprint) run on a
# Core connection: the read commands never import the ORM (tests/test_startup_imports.py).


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
        ``gleaner db upgrade`` stays an operator's step there (``store.schema_version``)."""
        from store.schema_version import ensure_schema

        with self._failures():
            return ensure_schema(self.engine, self.migrate)

    def reindex(self, *, progress: Callable[[int], None] | None = None) -> ReindexResult:
        """Index the notes the search index lacks, rebuilding it whole when it was built by
        another tokenizer version (``store.search_index``); ``progress`` gets the count so
        far after each batch."""
        from store.search_index import reindex

        with self._failures():
            return reindex(self.connection, progress=progress)

    def warm_up(self) -> None:
        """Do once what a process would otherwise do on its first harvest job: import the
        modules a job runs and configure the ORM's mappers. A worker calls it before its
        pool forks, so each child inherits the work. Connects to nothing."""
        from sqlalchemy.orm import configure_mappers

        import store.forget
        import store.jobs
        import store.ledger
        import store.locks
        import store.similar
        import store.writer  # noqa: F401

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
        from store.notes import write as write_note

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
        from store.notes import get as get_note

        return self._run(get_note, scope, slug)

    def read(self, scope: Scope | tuple[str, str], slug: str) -> NoteWithLinks:
        """The note with links, backlinks and superseder; NotFound when there is none."""
        from store.links import read as read_note

        return self._run(read_note, scope, slug)

    def history(self, scope: Scope | tuple[str, str], slug: str) -> list[NoteVersion]:
        """The note's earlier texts, newest first, each with when, why and by whom it was
        replaced; NotFound when there is no such note."""
        from store.history import history

        return self._run(history, scope, slug)

    def list_notes(
        self,
        scope: Scope | tuple[str, str],
        *,
        status: str | None = "live",
        pinned: bool | None = None,
        limit: int = 100,
    ) -> list[Note]:
        """The scope's notes, most recently changed first (see ``store.tending``)."""
        from store.tending import list_notes

        return self._read(list_notes, scope, status=status, pinned=pinned, limit=limit)

    def pin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Pin a live note by a person's choice: its body goes into the index text."""
        from store.tending import set_pinned

        return self._run(set_pinned, scope, slug, True)

    def unpin(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Unpin a note."""
        from store.tending import set_pinned

        return self._run(set_pinned, scope, slug, False)

    def archive(self, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
        """Archive a note: out of search and the index, its row and history kept."""
        from store.tending import archive

        return self._run(archive, scope, slug)

    def link(
        self, scope: Scope | tuple[str, str], from_slug: str, to_slug: str, rel: str
    ) -> LinkResult:
        """Add a ``related``/``derived_from``/``supersedes`` edge (idempotent)."""
        from store.links import link

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
        ``store.search``), said within ``[since, until)`` when given; with the query's
        ``vector`` of ``vector_model``, fused with the notes' vectors' ranking."""
        from store.search import search

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
        from store.index import fingerprint

        return self._read(fingerprint, scope)

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
        from store.index import index_text

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
        from store.mem import mem_save

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
        from store.mem import mem_session_summary

        return self._run(mem_session_summary, self.settings, user_id, content, title=title)

    def job(self, job_id: str) -> JobStatus | None:
        """The job's state, outcome and cost (no transcript), or None when there is none."""
        from store.job_status import job_status

        return self._run(job_status, job_id)

    def create_api_key(self, owner: str | None, *, read_only: bool = False) -> tuple[ApiKey, str]:
        """A new API key allowed ``owner`` (None: every owner) and its token, which is shown
        only now: the store keeps its sha256. A ``read_only`` key cannot submit, pin,
        delete or forget."""
        from store.keys import create_key

        return self._run(create_key, owner, read_only=read_only)

    def api_keys(self) -> list[ApiKey]:
        """Every API key (never a token), oldest first."""
        from store.keys import list_keys

        return self._run(list_keys)

    def revoke_api_key(self, key_id: str) -> ApiKey:
        """Delete the key with this id; InvalidInput (``unknown_key``) when there is none."""
        from store.keys import revoke_key

        return self._run(revoke_key, key_id)

    def verify_api_key(self, token: str) -> ApiKey | None:
        """The key a token is, or None when it is no live key."""
        from store.keys import verify_key

        # One read on every request of the HTTP service: on PostgreSQL it needs no BEGIN
        # and COMMIT round trips of its own (``statements``).
        with self.statements() as session:
            return verify_key(session, token)

    def forget_owner(self, principal: str, *, tombstones: bool = True) -> dict[str, int]:
        """Delete everything stored for an owner (see ``store.forget``); with ``tombstones``
        its harvested transcripts, harvested again, write nothing."""
        from store.forget import (  # rare: not paid by every command's start-up
            VACUUMED,
            forget_owner,
        )

        counts = self._run(forget_owner, principal, tombstones=tombstones)
        self._scrub_deleted(VACUUMED)
        return counts

    def forget_conversation(self, principal: str, conversation_id: str) -> dict[str, int]:
        """Forget one conversation of an owner (see ``store.forget_conversation``): the notes
        only it supports are deleted, those it changed get the text before it back, its
        history entries, jobs and ledger rows go, and its transcripts leave tombstones.
        Returns the counts (``forget_conversation.RECEIPT``); NotFound, with nothing changed,
        when nothing of the owner names the conversation."""
        from store.forget_conversation import VACUUMED, forget_conversation

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
        from store.export import write as write_export

        scope = Scope.owner(owner)
        with self.snapshot() as connection:
            return write_export(connection, scope, out, progress=progress)

    def export_lines(self, owner: str) -> Iterator[bytes]:
        """The owner's export line by line (each ending in ``\n``), the header first, read
        from one snapshot held while the iterator is consumed (closed with it)."""
        scope = Scope.owner(owner)  # a bad owner is refused now, not at the first line
        return self._export_lines(scope)

    def _export_lines(self, scope: Scope) -> Iterator[bytes]:
        from store.export import lines as export_lines

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
        ``store.restore``). Raises ``BadExport`` naming a bad line, ``InvalidInput``
        (``scope_not_empty``, ``bad_owner``)."""
        from store.restore import restore

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
        from store.decay import decay

        return decay(self.transaction, self.settings, dry_run=dry_run)

    def dedupe(self, *, dry_run: bool = False) -> DedupeResult:
        """Supersede near-duplicate notes changed since the last run; ``locked`` if one runs."""
        from store.dedupe import dedupe

        return self._run(dedupe, self.settings, dry_run=dry_run)


__all__ = ["NotFound", "Store"]
