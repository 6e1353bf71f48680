"""Owners are judged once, at the door, by one rule (``store.text.check_principal``); a bad
owner fails its own conversation and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from gleaner.cli import main
from gleaner.harvest.batch import Summary, harvest_paths, judge_owners
from gleaner.harvest.queue import record_settled
from gleaner.store import InvalidInput, Scope, Store
from gleaner.store.schema.models import Job, Memory
from gleaner.store.text import check_principal
from tests.test_harvest_job import transcript


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("alice", "alice"),
        ("\uff41\uff4c\uff49\uff43\uff45", "alice"),  # full-width letters
        ("Jose\u0301", "Jos\u00e9"),  # a decomposed accent
        ("Alice Smith", "Alice Smith"),
        ("a" * 255, "a" * 255),
    ],
)
def test_owners_are_normalized(given: str, stored: str) -> None:
    assert check_principal(given) == stored
    assert Scope.owner(given).id == stored


@pytest.mark.parametrize(
    "given",
    [
        "",
        " ",
        " alice",
        "alice\n",
        "ali\u200bce",  # zero-width space: would look exactly like alice
        "\ufeffalice",  # byte-order mark
        "alice\u202e",  # right-to-left override
        "a\x00b",
        "a" * 256,
        "al\ud800ice",  # lone surrogate
        "<private>alice</private>",
    ],
)
def test_bad_owners_are_refused_with_the_reason(given: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_principal(given)
    assert caught.value.reason == "bad_owner"
    with pytest.raises(InvalidInput):
        Scope.owner(given)


def test_mem_save_takes_the_same_rule(store: Store) -> None:
    with pytest.raises(ValueError, match="invisible"):
        store.mem_save("ali\u200bce", "x", type="decision", title="t")
    result = store.mem_save("\uff41lice", "x", type="decision", title="t")
    assert store.get(Scope.owner("alice"), "t") is not None and result.outcome == "created"


def write_native(path: Path, owner: str, cid: str) -> None:
    path.write_text(
        json.dumps(
            {
                "conversation_id": cid,
                "owner": owner,
                "messages": [{"role": "user", "content": "I prefer tabs over spaces."}],
            }
        )
    )


def test_a_bad_owner_fails_its_own_conversation_only(store: Store, tmp_path: Path) -> None:
    write_native(tmp_path / "a.json", "ali\u200bce", "hidden")
    write_native(tmp_path / "b.json", "x" * 300, "long")
    write_native(tmp_path / "c.json", "\ud800", "surrogate")
    write_native(tmp_path / "d.json", "bob", "good")
    summary = harvest_paths(store, [tmp_path])
    assert summary.harvested == 1 and summary.failed == 3
    assert all(f["error"].startswith("bad_owner:") for f in summary.failures)
    with store.transaction() as session:
        assert set(session.execute(select(Memory.scope_id)).scalars()) == {"bob"}


def test_a_batch_of_jobs_records_every_good_owner(store: Store) -> None:
    batch = [
        transcript("a", cid="ok-1", owner="bob"),
        transcript("b", cid="bad", owner="x" * 300),
        transcript("c", cid="ok-2", owner="erin"),
    ]
    summary = Summary()
    good = judge_owners(batch, None, summary)
    ids = record_settled(store, good, provenance="compaction", queue="harvest")
    assert len(ids) == 2 and [f["conversation"] for f in summary.failures] == ["bad"]
    with store.transaction() as session:
        assert set(session.execute(select(Job.owner)).scalars()) == {"bob", "erin"}


def test_cli_refuses_a_blank_owner_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--owner", " ", "anything"]) == 2
    assert "owner is empty" in capsys.readouterr().err
