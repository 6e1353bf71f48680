"""A restore's first pass: an export file read a line at a time (never whole), each record
checked against the schema, the unique keys of a scope, the links above it and the header's
counts; the first bad line raises ``BadExport`` naming its number."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from gleaner.config.store import StoreSettings
from gleaner.store.errors import BadExport, InvalidInput
from gleaner.store.owners.export import FORMAT as EXPORT_FORMAT
from gleaner.store.owners.export import VERSION as EXPORT_VERSION
from gleaner.store.owners.export_records import (
    Header,
    LinkRecord,
    json_object,
    link_record,
    note_row,
    parsed,
    version_row,
)
from gleaner.store.text import check_principal, quoted


def raw_lines(fp: IO[bytes] | IO[str], limit: int) -> Iterator[bytes]:
    """The file's lines as bytes, none over ``limit`` bytes (nor read whole into memory)."""
    number = 0
    while True:
        chunk = fp.readline(limit + 1)
        if not chunk:
            return
        number += 1
        raw = chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise BadExport(
                f"the line is over {limit:,} bytes: no record of this store is that long",
                line=number,
            )
        yield raw


@dataclass
class _Check:
    """What the first pass learns: the header, and what later lines are checked against."""

    header: Header
    slugs: dict[str, int] = field(default_factory=dict)  # slug -> its line
    topic_keys: dict[str, int] = field(default_factory=dict)
    session_hashes: dict[tuple[str, str], int] = field(default_factory=dict)
    edges: set[tuple[str, str, str]] = field(default_factory=set)
    superseded_by: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"note": 0, "version": 0, "link": 0})


def read_header(raw: bytes | None) -> Header:
    """The first line, checked: a Gleaner export of a version this Gleaner reads."""
    if raw is None:
        raise BadExport("the file is empty: an export starts with its header line", line=1)
    data = json_object(raw, 1)
    if data.get("kind") != EXPORT_FORMAT:
        raise BadExport(
            "not a Gleaner export: its first line must be the header "
            f'{{"kind": "{EXPORT_FORMAT}", "version": {EXPORT_VERSION}, ...}}',
            line=1,
        )
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > EXPORT_VERSION:
        raise BadExport(
            f"the file is export version {version}, written by a newer Gleaner; this one "
            f"reads version {EXPORT_VERSION}: restore it with that Gleaner",
            line=1,
        )
    found = cast(Header, parsed(Header, data, "the header", 1))
    if found.version != EXPORT_VERSION:
        raise BadExport(f"unknown export version {found.version}", line=1)
    try:
        check_principal(found.owner)
    except InvalidInput as exc:
        raise BadExport(f"the header's owner: {exc.message}", line=1, rule=exc.reason) from None
    return found


def _check_record(state: _Check, data: dict[str, Any], settings: StoreSettings, number: int) -> str:
    """Check one record line against the schema, the write rules and the lines above it;
    returns its kind."""
    kind = data.get("kind")
    if kind == "note":
        row = note_row(data, settings, number)
        slug = row["slug"]
        _unique(state.slugs, slug, number, f"the slug {quoted(slug)}")
        if row["topic_key"] is not None:
            key = row["topic_key"]
            _unique(state.topic_keys, key, number, f"the topic key {quoted(key)}")
        elif row["session_id"] is not None:
            pair = (row["session_id"], row["content_hash"])
            _unique(state.session_hashes, pair, number, "the same body in the same session")
    elif kind == "version":
        row = version_row(data, settings, number)
        _known(state, row["slug"], number, f"version of {quoted(row['slug'])}")
    elif kind == "link":
        _check_link(state, link_record(data, number), number)
    else:
        raise BadExport(
            f"unknown record kind {quoted(kind)}: a line is a note, version or link", line=number
        )
    state.counts[kind] += 1
    return str(kind)


def _unique(seen: dict[Any, int], key: Any, number: int, what: str) -> None:
    if key in seen:
        raise BadExport(f"{what} is on line {seen[key]} already", line=number)
    seen[key] = number


def _known(state: _Check, slug: str, number: int, what: str) -> None:
    if slug not in state.slugs:
        raise BadExport(
            f"{what}: no note {quoted(slug)} above this line (notes come first)", line=number
        )


def _check_link(state: _Check, found: LinkRecord, number: int) -> None:
    """Both ends are notes above; no self-link, no edge twice; ``supersedes`` keeps rule 7."""
    what = f"link {quoted(found.from_)} {found.rel} {quoted(found.to)}"
    _known(state, found.from_, number, what)
    _known(state, found.to, number, what)
    if found.from_ == found.to:
        raise BadExport(f"{what}: a note cannot link to itself", line=number, rule="self_link")
    edge = (found.from_, found.to, found.rel)
    if edge in state.edges:
        raise BadExport(f"{what} is in the file twice", line=number)
    if found.rel == "supersedes":
        holder = state.superseded_by.get(found.to)
        if holder is not None:
            raise BadExport(
                f"{what}: {quoted(found.to)} is already superseded by {quoted(holder)}",
                line=number,
                rule="already_superseded",
            )
        current: str | None = found.from_
        while current is not None:
            if current == found.to:
                raise BadExport(f"{what} would form a cycle", line=number, rule="cycle")
            current = state.superseded_by.get(current)
        state.superseded_by[found.to] = found.from_
    state.edges.add(edge)


def check_records(
    lines: Iterator[bytes],
    header: Header,
    settings: StoreSettings,
    *,
    on_record: Callable[[int], None] | None = None,
) -> _Check:
    """The first pass over the records (the lines after the header); ``on_record`` gets the
    count checked so far. Ends by holding the records to the header's counts."""
    state = _Check(header)
    number = 1
    for number, raw in enumerate(lines, start=2):
        _check_record(state, json_object(raw, number), settings, number)
        if on_record is not None:
            on_record(number - 1)
    said = header.counts
    for kind, expected in (("note", said.notes), ("version", said.versions), ("link", said.links)):
        if state.counts[kind] != expected:
            raise BadExport(
                f"the header counts {expected} {kind}(s), the file holds {state.counts[kind]}: "
                "it is incomplete or was edited (end of file)",
                line=number + 1,
            )
    return state
