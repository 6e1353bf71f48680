"""Gleaner's errors survive pickling: a Celery pool child hands a task's error to the main
process pickled, and one that cannot be rebuilt arrives as Celery's unpickleable wrapper
with its reason and extra fields gone."""

from __future__ import annotations

import pickle

import pytest

import gleaner.errors
import gleaner.harvest.errors
import gleaner.store.errors
from gleaner.harvest.outcome import Counts
from gleaner.store.errors import ReasonedError, StorageFailure


def _every_error() -> list[type[ReasonedError]]:
    found: list[type[ReasonedError]] = []
    todo: list[type[ReasonedError]] = [ReasonedError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _made(cls: type[ReasonedError]) -> ReasonedError:
    if cls is gleaner.harvest.errors.UnrecordedHarvest:
        return cls(StorageFailure("gone", reason="db_down"), Counts(model_calls=2))  # type: ignore[call-arg]
    if cls is gleaner.harvest.errors.ResponseFormatRejected:
        return cls("refused", format="json_schema")  # type: ignore[call-arg]
    if cls is gleaner.store.errors.BadExport:
        return cls("not JSON", line=7, rule="bad_type")  # type: ignore[call-arg]
    try:
        return cls("bad thing", reason="why_not")
    except TypeError:  # its __init__ takes fields of its own instead
        return cls("bad thing")


def test_the_tree_is_the_one_the_modules_define() -> None:
    names = {cls.__name__ for cls in _every_error()}
    assert {"StorageFailure", "UnrecordedHarvest", "ResponseFormatRejected"} <= names
    assert gleaner.store.errors.InvalidInput.__name__ in names
    assert gleaner.errors.GleanerError.__name__ in names


@pytest.mark.parametrize("cls", _every_error(), ids=lambda cls: cls.__name__)
def test_an_error_comes_back_from_pickle_with_its_reason_message_and_fields(
    cls: type[ReasonedError],
) -> None:
    error = _made(cls)
    copied = pickle.loads(pickle.dumps(error))
    assert type(copied) is cls
    assert (str(copied), copied.reason, copied.args) == (str(error), error.reason, error.args)
    assert vars(copied) == vars(error)
