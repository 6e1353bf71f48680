"""``Gleaner``: the one object a platform's backend needs (and the HTTP and MCP services use).

Built on the store and the harvest pipeline: a submitted conversation is recorded as a job
exactly as ``gleaner enqueue`` records one (redacted first), then sent to the ``harvest``
queue when GLEANER_BROKER_URL is set, or harvested right away in this process when it is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from types import TracebackType
from typing import IO, TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from gleaner.conversation import (
    Conversation,
    ConversationInput,
    read_conversation,
    read_settled,
)
from gleaner.errors import InvalidRequest, NotFound, translated
from gleaner.params import (
    checked,
    checked_conversation_id,
    checked_job_id,
    checked_query,
    checked_slug,
)
from gleaner.sending import JobSender
from gleaner.store import Note, NoteVersion
from gleaner.store.schemas import LinkedNote
from gleaner.store.text import quoted

if TYPE_CHECKING:
    from gleaner.harvest.intake import Settled
    from gleaner.store import SaveResult, SearchHit, Settings, Store
    from gleaner.store.jobs.status import JobStatus
    from gleaner.store.keys import ApiKey
    from gleaner.store.owners.restore import RestoreResult


class NoteDetail(BaseModel):
    """A note with its links both ways, its superseder, and its earlier texts (newest first)."""

    model_config = ConfigDict(frozen=True)

    memory: Note
    links: list[LinkedNote]
    backlinks: list[LinkedNote]
    superseded_by: str | None
    history: list[NoteVersion]


class Gleaner:
    """Gleaner on one database: hand over conversations, follow their jobs, read the notes.

    ``Gleaner()`` takes its configuration from the ``GLEANER_*`` environment;
    ``Gleaner(database_url, settings)`` overrides it. A SQLite file is migrated at once when
    its schema is missing or older (as ``gleaner harvest`` does); on PostgreSQL nothing
    connects until the first call (run ``gleaner db upgrade`` once before).
    Every method takes the owner it acts for: it never reads or changes another's notes.
    Errors are :mod:`gleaner.errors` (``InvalidRequest``, ``TooLarge``, ``NotFound``,
    ``Unavailable``), each with a ``reason``.
    """

    def __init__(
        self,
        database_url: str | None = None,
        settings: Settings | None = None,
        *,
        store: Store | None = None,
    ) -> None:
        from gleaner.store import Store

        with translated():
            self.store = store or Store(database_url, settings=settings)
            if self.store.dialect == "sqlite":
                self.store.ensure_schema()
        self.settings = self.store.settings
        self._sender = JobSender(self.settings)

    # --- lifetime --------------------------------------------------------------------

    @property
    def queued(self) -> bool:
        """Whether ``submit`` queues (a broker is set) rather than harvesting in process."""
        return bool(self.settings.broker_url)

    def migrate(self) -> None:
        """Bring the database's schema up to date (``gleaner db upgrade``)."""
        with translated():
            self.store.migrate()

    def close(self) -> None:
        """Close the database connections (the object is still usable: they reopen)."""
        self.store.dispose()

    def __enter__(self) -> Gleaner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- conversations in ------------------------------------------------------------

    def read(
        self,
        conversation: ConversationInput,
        *,
        owner: str | None = None,
        reassign_owner: bool = False,
        upload: bool = False,
    ) -> Conversation:
        """Read one conversation (bytes, text or parsed JSON, in any format the CLI reads)
        and settle its owner, recording nothing: what ``submit`` does first. ``owner`` fills
        in a conversation that names none; ``reassign_owner`` overrides the one it names;
        ``upload`` bounds it (a zip inflated) by GLEANER_HTTP_MAX_BODY_BYTES as well."""
        return read_conversation(
            conversation,
            self.settings,
            owner=owner,
            reassign_owner=reassign_owner,
            upload=upload,
        )

    def submit(
        self,
        conversation: ConversationInput | Conversation,
        *,
        owner: str | None = None,
        reassign_owner: bool = False,
    ) -> str:
        """Record one finished conversation as a harvest job and return the job's id.

        The transcript is redacted before it is recorded. With a broker the job is sent to
        the ``harvest`` queue (a worker harvests it); without one it is harvested here before
        this returns. Either way ``job(id)`` follows it. A ``Conversation`` from ``read``
        keeps the owner settled there (``owner`` must then be None); one whose transcript
        names another owner than its own is refused (``bad_owner``) unless ``read`` put it
        there (``reassign_owner=True``).
        """
        from gleaner.harvest.queue import record_settled
        from gleaner.harvest.queues import LIVE_QUEUE

        if isinstance(conversation, Conversation):
            if owner is not None or reassign_owner:
                raise InvalidRequest(
                    "a read conversation keeps the owner settled by read()", reason="bad_owner"
                )
            # One read() made was taken in there: recorded as it is.
            settled = conversation.taken_in() or _take_in(conversation)
        else:
            settled = read_settled(
                conversation, self.settings, owner=owner, reassign_owner=reassign_owner
            )
        with translated():
            (job_id,) = record_settled(
                self.store, [settled], provenance="compaction", queue=LIVE_QUEUE
            )
        if self.queued:
            self._sender.send(LIVE_QUEUE, job_id)
        else:
            from gleaner.harvest.queue import run_job_here

            with translated():
                result = run_job_here(self.store, job_id)
            if result and (result.get("notes_written") or result.get("notes_updated")):
                from gleaner.harvest.embed_notes import embed_after_harvest
                from gleaner.store import Scope

                # The notes are committed and searchable; their vectors follow (a failure
                # is logged and left for the sweep).
                embed_after_harvest(self.store, [Scope.owner(str(result["owner"]))])
        return job_id

    def job(self, job_id: str, *, owner: str | None = None) -> JobStatus:
        """A job's state, outcome and cost (model calls and tokens over every run). With
        ``owner``, a job of another owner is NotFound, like one that does not exist; an id
        no job can have (NUL, ...) is InvalidRequest (``bad_job_id``)."""
        job_id = checked_job_id(job_id)
        with translated():
            found = self.store.job(job_id)
            name = None if owner is None else self.owner_name(owner)
        if found is None or (name is not None and found.owner != name):
            raise NotFound(f"no job with id {quoted(job_id)}", reason="not_found")
        return found

    # --- notes out -------------------------------------------------------------------

    def search(
        self,
        owner: str,
        query: str,
        *,
        limit: int = 10,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[SearchHit]:
        """The owner's live notes matching any word of ``query``, best first (at most
        ``limit``), said within ``[since, until)`` when given; each hit's ``memory.said_at``
        says when its fact was said. With GLEANER_EMBED_MODEL set, the notes' vectors are
        searched too and the two rankings fused (``backend`` "hybrid")."""
        from gleaner.store import Scope

        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 100:
            raise InvalidRequest(f"limit must be 1..100, got {quoted(limit)}", reason="bad_limit")
        from gleaner.metrics import SEARCH_SECONDS

        query = checked_query(query)
        with translated(), SEARCH_SECONDS.time():
            vector, model = self._query_vector(query)
            return self.store.search(
                Scope.owner(owner),
                query,
                limit=limit,
                since=since,
                until=until,
                vector=vector,
                vector_model=model,
            )

    def _query_vector(self, query: object) -> tuple[list[float] | None, str | None]:
        """The query's vector and its model when semantic recall is configured (else, or
        when the embedder fails, None: the search is lexical)."""
        if not self.settings.embed_model or not isinstance(query, str) or not query.strip():
            return None, None
        from gleaner.harvest.embed_notes import query_vector

        found = query_vector(self.settings, query)
        return (None, None) if found is None else found

    def note(self, owner: str, slug: str) -> NoteDetail:
        """The owner's note ``slug`` with its links, superseder and history, read in one
        transaction; NotFound when the owner has no such note."""
        from gleaner.store import Scope
        from gleaner.store.notes import history, links

        slug = checked_slug(slug)
        with translated():
            scope = Scope.owner(owner)
            with self.store.transaction() as session:
                found = links.read(session, scope, slug)
                earlier = history.history(session, scope, slug)
        return NoteDetail(
            memory=found.memory,
            links=found.links,
            backlinks=found.backlinks,
            superseded_by=found.superseded_by,
            history=earlier,
        )

    def index_text(self, owner: str, query: str | None = None) -> str:
        """The compact memory index of the owner's notes that goes into a system prompt:
        pinned notes, then (with ``query``, the conversation so far) the notes most relevant
        to it, then other titles, within the token budget."""
        from gleaner.store import Scope

        if query is not None:
            query = checked_query(query)
        with translated():
            vector, model = self._query_vector(query)
            return self.store.index_text(
                Scope.owner(owner), query, vector=vector, vector_model=model
            )

    def forget(self, owner: str, *, allow_reharvest: bool = False) -> dict[str, int]:
        """Delete everything stored for the owner (notes, history, jobs, ...) in one
        transaction; counts by table. Its harvested conversations leave hash tombstones, so
        submitted again they write nothing, unless ``allow_reharvest``. API keys allowed this
        owner alone go too (they hold the name); keys for every owner stay."""
        with translated():
            return self.store.forget_owner(self.owner_name(owner), tombstones=not allow_reharvest)

    def forget_conversation(self, owner: str, conversation_id: str) -> dict[str, int]:
        """Forget one conversation of the owner, in one transaction: the notes only it
        supports are deleted, a note it changed gets back the text before it, its history
        entries, jobs and ledger rows go, and its transcripts leave hash tombstones, so
        submitted again they write nothing; a harvest of it still running writes nothing.
        Counts by what was done (``notes_deleted``, ``notes_restored``, ``versions``, ...).
        NotFound when nothing of the owner names the conversation (another owner's
        conversation with the same id is never touched). A conversation id no conversation
        can have (NUL, ...) is InvalidRequest (``bad_conversation_id``)."""
        conversation_id = checked_conversation_id(conversation_id)
        with translated():
            return self.store.forget_conversation(self.owner_name(owner), conversation_id)

    def mem_save(
        self,
        owner: str,
        content: str,
        *,
        type: str,
        title: str,
        topic_key: str | None = None,
    ) -> SaveResult:
        """Save an observation for the owner (seed 003's ``mem_save``)."""
        with translated():
            return self.store.mem_save(owner, content, type=type, title=title, topic_key=topic_key)

    def mem_session_summary(
        self, owner: str, content: str, *, title: str = "Session summary"
    ) -> SaveResult:
        """Save the owner's active session's summary and end the session."""
        with translated():
            return self.store.mem_session_summary(owner, content, title=title)

    # --- export and restore ----------------------------------------------------------

    def export(self, owner: str) -> Iterator[bytes]:
        """The owner's notes, history and links as JSON Lines (docs/EXPORT.md), line by line
        (each ending in ``\\n``), the header first: read from one snapshot of the database,
        held while the iterator is consumed. ``out.writelines(g.export("alice"))`` writes
        the file; an HTTP handler can stream it as it comes."""
        name = self.owner_name(owner)  # a bad owner is refused now, not at the first line
        with translated():
            lines = self.store.export_lines(name)
        return _translated(lines)

    def restore(
        self,
        export: IO[bytes] | IO[str],
        *,
        owner: str | None = None,
        reassign_owner: bool = False,
    ) -> RestoreResult:
        """Load an export (a file object, binary or text) into its owner, who must have no
        notes (``scope_not_empty``); into ``owner`` only when ``reassign_owner`` says so,
        if the file names another (``bad_owner``). Every line is checked before anything
        is written (``bad_export``, naming the line); then it is one transaction."""
        with translated():
            return self.store.restore(export, owner, reassign_owner=reassign_owner)

    # --- owners and keys -------------------------------------------------------------

    def owner_name(self, owner: str) -> str:
        """The owner as stored (the owner rule: NFKC, no blank, no control characters...);
        InvalidRequest (``bad_owner``) when it breaks the rule."""
        from gleaner.store.text import check_principal

        with translated():
            return check_principal(owner)

    def create_api_key(self, owner: str | None, *, read_only: bool = False) -> tuple[ApiKey, str]:
        """A new API key for ``owner`` (None: every owner) and its token, shown only now. A
        ``read_only`` key searches, reads, gets the index and follows jobs, but cannot
        submit, pin, delete or forget (the services refuse it, ``read_only_key``)."""
        with translated():
            return self.store.create_api_key(owner, read_only=read_only)

    def api_keys(self) -> list[ApiKey]:
        """Every API key (ids, owners, whether read-only, creation times; never a token)."""
        with translated():
            return self.store.api_keys()

    def revoke_api_key(self, key_id: str) -> ApiKey:
        """Delete an API key; NotFound when there is none with that id."""
        checked(key_id, "key id", reason="bad_key_id", max_chars=32)
        try:
            with translated():
                return self.store.revoke_api_key(key_id)
        except InvalidRequest as exc:
            raise NotFound(exc.message, reason="not_found") from exc

    def verify_api_key(self, token: str) -> ApiKey | None:
        """The API key a token is, or None when it is none (unknown or revoked)."""
        with translated():
            return self.store.verify_api_key(token)


def _translated(lines: Iterator[bytes]) -> Iterator[bytes]:
    """``lines``, with an error raised while reading them translated (``translated``)."""
    with translated():
        yield from lines


def _take_in(conversation: Conversation) -> Settled:
    """A Conversation built by hand (or changed after ``read``), taken in: its transcript
    redacted, into the owner it names; refused (``bad_owner``) when its transcript names
    another owner and ``read`` did not put it there."""
    from gleaner.harvest.intake import settle
    from gleaner.store.text import check_principal

    named = conversation.transcript.owner
    with translated():  # the one owner rule: compared as read() settles a name
        named = None if named is None else check_principal(named)
    if named not in (None, conversation.owner) and not conversation.reassigned:
        raise InvalidRequest(
            "the conversation's transcript names another owner than the Conversation: "
            "read it with reassign_owner=True to put it in that scope",
            reason="bad_owner",
        )
    with translated():
        return settle(conversation.transcript, conversation.owner, reassign_owner=True)
