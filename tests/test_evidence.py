"""Evidence: what a note rests on (quotes of its conversation, each with its speaker), kept
with the text it grounds, in history too; refused when malformed. On both databases."""

from __future__ import annotations

import pytest

from store import InvalidInput, Scope, Store

ALICE = Scope.owner("alice")
QUOTE = {"speaker": "user", "quote": "I moved to Porto last spring"}


def test_evidence_is_stored_shown_and_kept_in_history(store: Store) -> None:
    first = store.write(
        ALICE,
        {
            "title": "Lives in Porto",
            "body": "Moved in spring.",
            "slug": "city",
            "evidence": [QUOTE],
        },
    )
    assert [e.model_dump() for e in first.memory.evidence] == [QUOTE]
    later = {"speaker": "user", "quote": "we moved on to Lisbon"}
    store.write(
        ALICE,
        {"title": "Lives in Lisbon", "body": "Moved again.", "slug": "city", "evidence": [later]},
    )
    note = store.read(ALICE, "city").memory
    assert [e.quote for e in note.evidence] == [later["quote"]]
    (version,) = store.history(ALICE, "city")
    assert [e.model_dump() for e in version.evidence] == [QUOTE]
    plain = store.write(ALICE, {"title": "No evidence", "body": "Written by hand."})
    assert plain.memory.evidence == []


@pytest.mark.parametrize(
    "evidence",
    [
        "a quote",
        [QUOTE] * 4,
        [{"speaker": "user"}],
        [{"speaker": "user", "quote": "x", "extra": 1}],
        [{"speaker": "user", "quote": "nul \x00 here"}],
        [{"speaker": 3, "quote": "x"}],
    ],
)
def test_malformed_evidence_is_refused_and_nothing_is_written(
    store: Store, evidence: object
) -> None:
    with pytest.raises(InvalidInput) as refused:
        store.write(ALICE, {"title": "T", "body": "B", "evidence": evidence})
    assert refused.value.reason in {"bad_evidence", "nul_character", "bad_type"}
    assert store.fingerprint(ALICE) == (0, 0)
