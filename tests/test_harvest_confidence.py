"""GLEANER_HARVEST_MIN_CONFIDENCE: a harvested note its model is not sure of is dropped and
counted, never written (issue 15: SmolLM2-135M's one stored note had confidence 0).

The model is the local OpenAI-compatible server of ``tests.llm_server``; the notes go through
the whole harvest job into a real store on both backends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.offline_cues import MIN_CONFIDENCE as OFFLINE_FLOOR
from gleaner.store import ConfigError, Scope, Store, load_settings
from gleaner.store.schema.models import HarvestLedger, Memory
from gleaner.store.settings import Settings
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.test_harvest_job import model_settings, rows, transcript

ALICE = Scope.owner("alice")


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def harvest_confidences(store: Store, server: LLMServer, *confidences: float) -> list[str]:
    """Harvest one transcript whose model answers one note per confidence ("Fact at 0.5");
    the titles written, sorted."""
    server.script(answer([note(f"Fact at {c}", confidence=c) for c in confidences]))
    report = harvest_transcript(store, transcript("Some facts about me."))
    assert report.status == "harvested", report.error
    return sorted(n.title for n in rows(store, Memory))


def test_a_note_of_confidence_zero_is_dropped_and_one_at_the_minimum_kept(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    assert store.settings.harvest_min_confidence == 0.1  # the default
    server.script(
        answer(
            [
                note("Release notes of version 2.3", confidence=0.0),  # SmolLM2's stored note
                note("Prefers tabs over spaces", confidence=0.1),
                note("Chose PostgreSQL for billing", confidence=0.9),
            ]
        )
    )
    report = harvest_transcript(store, transcript("I like tabs. We chose PostgreSQL."))
    assert (report.status, report.notes_written, report.items_dropped) == ("harvested", 2, 1)
    assert sorted(n.title for n in rows(store, Memory)) == [
        "Chose PostgreSQL for billing",
        "Prefers tabs over spaces",
    ]
    [entry] = rows(store, HarvestLedger)
    assert (entry.notes_written, entry.items_dropped) == (2, 1)


@pytest.mark.parametrize(
    ("minimum", "written"),
    [
        (0.0, ["Fact at 0.0", "Fact at 0.3", "Fact at 0.9"]),  # the default would drop 0.0
        (0.5, ["Fact at 0.9"]),  # the default would keep 0.3
        (0.9, ["Fact at 0.9"]),
        (1.0, []),
    ],
)
def test_the_setting_is_the_minimum(
    make_store, backend, server, minimum: float, written: list[str]
) -> None:
    store = make_store(backend, **model_settings(server, harvest_min_confidence=minimum))
    assert harvest_confidences(store, server, 0.9, 0.3, 0.0) == written
    [entry] = rows(store, HarvestLedger)
    assert entry.items_dropped == 3 - len(written)


def test_explicit_writes_keep_any_confidence(store: Store) -> None:
    # The minimum is a harvest rule: a caller writing through the store says what it means.
    result = store.write(ALICE, {"title": "A hunch", "body": "Maybe.", "confidence": 0.0})
    assert result.created
    kept = store.get(ALICE, result.memory.slug)
    assert kept is not None and kept.confidence == 0.0


def test_the_offline_harvester_is_never_below_the_default() -> None:
    # Its notes carry 0.5 to 0.9 (tests/test_offline.py): the default drops none of them.
    assert Settings.model_fields["harvest_min_confidence"].default < OFFLINE_FLOOR


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment with no GLEANER_ variable but those the test sets."""
    for name in list(os.environ):
        if name.startswith("GLEANER_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("value", ["1.5", "-0.1", "sure"])
def test_a_minimum_outside_zero_to_one_names_the_setting(
    clean_env: pytest.MonkeyPatch, value: str
) -> None:
    clean_env.setenv("GLEANER_HARVEST_MIN_CONFIDENCE", value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "GLEANER_HARVEST_MIN_CONFIDENCE" in str(caught.value)
    assert repr(value) in str(caught.value)


def test_the_minimum_is_read_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("GLEANER_HARVEST_MIN_CONFIDENCE", "0.25")
    assert load_settings().harvest_min_confidence == 0.25
