"""Property tests of the pure text rules: slugify, normalize_topics, the privacy strip, snippet."""

from __future__ import annotations

import hashlib
import re

from hypothesis import example, given
from hypothesis import strategies as st

from gleaner.privacy import REDACTED, strip_private
from gleaner.store.text import content_hash, normalize_topics, slugify, snippet, topics

SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
TOPIC = re.compile(r"^[\w.\-]+$")
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@given(texts)
@example("")
@example("日本語")
@example("Chose SQLite over Postgres!")
def test_slugify_gives_a_valid_bounded_idempotent_slug(title: str) -> None:
    slug = slugify(title)
    assert SLUG.match(slug), slug
    assert len(slug) <= 64
    assert slugify(slug) == slug


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), max_size=20))
@example(["C++", "Machine Learning", "a/b"])
def test_normalize_topics_obeys_the_rule(raw: list[str]) -> None:
    normalized = normalize_topics(raw)
    found = topics(normalized)
    assert len(found) <= 8
    assert len(set(found)) == len(found)
    for topic in found:
        assert len(topic) <= 40
        assert TOPIC.match(topic), topic
        assert topic == topic.lower()
    assert normalize_topics(normalized) == normalized


@given(texts, texts, texts)
def test_private_text_never_survives(before: str, secret: str, after: str) -> None:
    marker = "S3CR3T" + hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    for tag in ("<private>", "<PRIVATE>", "<Private note='x'>"):
        closed = strip_private(f"{before}{tag}{secret}{marker}\n{secret}</private>{after}")
        unclosed = strip_private(f"{before}{tag}{secret}{marker}")
        for out in (closed, unclosed):
            assert marker not in out
            assert not re.search(r"<private(\s|>|$)", out, re.IGNORECASE)
        assert unclosed.endswith(REDACTED)


@given(texts)
def test_strip_private_leaves_text_without_tags_alone(text: str) -> None:
    if "<private" not in text.lower():
        assert strip_private(text) == text


@given(texts, texts)
def test_content_hash_ignores_case_and_whitespace_layout(a: str, b: str) -> None:
    spaced = f"  {a.upper()} \n\t {b}  "
    assert content_hash(spaced) == content_hash(" ".join(f"{a.upper()} {b}".split()).lower())


@given(
    texts,
    st.lists(st.text(min_size=1, max_size=10), max_size=3),
    st.integers(min_value=10, max_value=300),
)
def test_snippet_is_bounded_collapsed_and_shows_the_word(
    body: str, query: list[str], width: int
) -> None:
    out = snippet(body, query, width)
    assert len(out) <= width + 2  # plus an ellipsis either side
    assert "  " not in out and "\n" not in out
    collapsed = " ".join(body.split())
    if len(collapsed) <= width:
        assert out == collapsed
    found = [w for w in query if w and w.lower() in collapsed.lower()]
    if found and found[0].strip() == found[0] and len(found[0]) <= width // 2:
        assert found[0].lower() in out.lower()


def test_snippet_without_a_match_is_the_start() -> None:
    body = "start " + "word " * 100
    assert snippet(body, ["absent"], 20) == "start word word word…"
