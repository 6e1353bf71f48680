"""Hostile input at the limits: redaction reads the text once however it is shaped, a size
refusal names the field, its real limit and only a setting that sets it, and a path a command
cannot find is shown redacted."""

from __future__ import annotations

import random
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from gleaner.cli import main
from gleaner.harvest.redact import redact_messages, redact_text
from gleaner.harvest.transcript import Message
from gleaner.privacy import redact_private
from gleaner.store import InvalidInput, Scope, Store, format_error
from gleaner.store.recall import index as index_mod
from gleaner.store.recall.index import strip_index_text

ALICE = Scope.owner("alice")
OPEN, CLOSE = "<gleaner-memory-index", "</gleaner-memory-index>"
# The pattern strip_index_text was before it scanned by hand: the reference for what it strips.
# It rescanned to the end of the text at every opening tag with no ">" (quadratic).
REFERENCE = re.compile(
    r"<gleaner-memory-index\b[^>]*>.*?(?:</gleaner-memory-index>|\Z)", re.DOTALL | re.IGNORECASE
)


def reference_strip(text: str) -> str:
    return REFERENCE.sub(lambda m: "<private>" if redact_private(m.group(0))[1] else "", text)


# Redaction is linear ------------------------------------------------------------------------


class CountedText(str):
    """A text that counts the characters ``find`` examines."""

    __slots__ = ()
    examined = 0

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:
        found = str.find(self, sub, start, end)
        begin = 0 if start is None else start
        CountedText.examined += (len(self) if found < 0 else found + len(sub)) - begin
        return found


class CountedPattern:
    """A compiled pattern that counts the characters its searches examine."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        found = self.pattern.search(text, pos)
        CountedText.examined += (len(text) if found is None else found.end()) - pos
        return found


@pytest.mark.parametrize(
    "unit",
    [
        "<gleaner-memory-index ",  # an opening tag with no ">" anywhere after it
        "<GLEANER-memory-index x=1 ",
        "<gleaner-memory-index>x",  # opened, never closed
        "<gleaner-memory-index>x</gleaner-memory-index>y",  # closed, many blocks
        "<gleaner-memory-index>x</gleaner-memory-index <",  # closing tags that do not close
        "<gleaner-memory-indexer>",  # not the tag
    ],
)
def test_the_index_scan_reads_each_character_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, unit: str
) -> None:
    for name in ("_INDEX_OPEN_TAG", "_INDEX_CLOSE_TAG"):
        monkeypatch.setattr(index_mod, name, CountedPattern(getattr(index_mod, name)))
    for repeats in (1_000, 8_000):
        text = unit * repeats
        CountedText.examined = 0
        blocks = list(index_mod.index_blocks(CountedText(text)))
        assert CountedText.examined <= 2 * len(text) + len(CLOSE), (unit, repeats)
        if repeats == 1_000:  # the reference is quadratic on some of these
            assert strip_index_text(text) == reference_strip(text)
        assert all(a[1] <= b[0] for a, b in pairwise(blocks))


def test_an_index_tag_flood_of_megabytes_is_redacted_as_before() -> None:
    flood = "<gleaner-memory-index " * 200_000  # 4.4 MB; hours to read with the old pattern
    assert redact_text(flood) == flood
    assert redact_text("<private>key</private> " + flood) == "[REDACTED] " + flood
    # One ">" at the end makes the first opener a block, never closed: all of it goes, and a
    # <private> left open in it stays open.
    assert redact_text(flood + "<private>key</private>") == ""
    assert redact_text("kept " + flood + "> gone") == "kept "
    assert redact_text("kept " + flood + "> <private> after") == "kept [REDACTED]"
    messages = [Message(role="user", content=flood), Message(role="assistant", content="ok")]
    assert [m.content for m in redact_messages(messages)] == [flood, "ok"]


def test_the_index_scan_strips_what_the_old_pattern_stripped() -> None:
    pieces = [
        OPEN,
        OPEN.upper(),
        CLOSE,
        "</GLEANER-MEMORY-INDEX>",
        ">",
        "<",
        " ",
        "\n",
        "a",
        "x=1",
        "-x",
        "<private>",
        "</private>",
        "<private ",
        "[REDACTED]",
        "é",
    ]
    rng = random.Random(4)
    for _ in range(4_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert strip_index_text(text) == reference_strip(text), text


# Size refusals name the right limit ---------------------------------------------------------


def refusal(call: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        call()
    return caught.value


def test_a_title_over_its_fixed_limit_names_the_title_and_no_setting(make_store: Any) -> None:
    store: Store = make_store("sqlite")
    error = refusal(lambda: store.write(ALICE, {"title": "t" * 1_001, "body": "b"}))
    assert error.reason == "body_too_large"
    assert str(error) == "title is 1,001 bytes, over the limit of 1,000 bytes"
    error = refusal(lambda: store.mem_save("alice", "c", type="decision", title="é" * 501))
    assert str(error) == "title is 1,002 bytes, over the limit of 1,000 bytes"


def test_a_topic_key_over_its_fixed_limit_names_the_key_and_no_setting(make_store: Any) -> None:
    store: Store = make_store("sqlite")
    error = refusal(
        lambda: store.mem_save("alice", "c", type="decision", title="T", topic_key="x" * 300)
    )
    assert error.reason == "body_too_large"
    assert str(error) == "topic_key is 300 bytes, over the limit of 255 bytes"
    assert "GLEANER_" not in format_error(error)


def test_a_body_over_its_limit_names_the_setting_that_sets_it(make_store: Any) -> None:
    store: Store = make_store("sqlite", max_body_bytes=100)
    for call in (
        lambda: store.write(ALICE, {"title": "T", "body": "b" * 101}),
        lambda: store.mem_save("alice", "c" * 101, type="decision", title="T"),
    ):
        error = refusal(call)
        assert error.reason == "body_too_large"
        assert "is 101 bytes, over the limit of 100 bytes (GLEANER_MAX_BODY_BYTES" in str(error)


def test_other_fixed_limits_name_no_setting(make_store: Any) -> None:
    store: Store = make_store("sqlite")
    error = refusal(lambda: store.search(ALICE, "q" * 4_001))
    assert str(error) == "query is 4,001 bytes, over the limit of 4,000 bytes"
    source = {"title": "T", "body": "b", "source": {"url": "u" * 4_001}}
    assert "GLEANER_" not in str(refusal(lambda: store.write(ALICE, source)))


# A missing path is shown redacted -----------------------------------------------------------


@pytest.mark.parametrize("command", [["harvest"], ["import"]])
def test_a_missing_path_is_named_with_its_private_span_redacted(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLEANER_DATABASE_URL", f"sqlite:///{tmp_path / 'g.db'}")
    path = "in/p/<private>NOSUCHFILE</private>.json"
    assert main([*command, path, "--owner", "alice"]) == 2
    out, err = capsys.readouterr()
    assert "gleaner: error: no such file or folder: in/p/[REDACTED].json" in err
    assert "NOSUCHFILE" not in out + err
    assert not (tmp_path / "g.db").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["harvest", "x.json", "--owner", "a", "<private>ARGSECRET</private>"],
        ["harvest", "x.json", "--provenance", "<private>ARGSECRET</private>"],
    ],
)
def test_a_bad_command_line_is_quoted_with_its_private_spans_redacted(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from gleaner.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "[REDACTED]" in err and "ARGSECRET" not in err
