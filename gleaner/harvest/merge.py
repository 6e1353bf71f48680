"""One answer's notes made one list (what ``harvest.model.extract`` returns): topic keys
spelled as the owner's, notes of one title that hold one fact merged, the most confident
kept."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gleaner.harvest.candidate import NoteCandidate
from gleaner.store.notes import judge
from gleaner.store.notes.terms import FactText


def _title_key(title: str) -> str:
    # Case, spacing and closing punctuation aside: "Uses C++" and "Uses C#" stay two titles.
    return " ".join(title.casefold().split()).rstrip(".!?;:, ")


def spelled_as_known(
    notes: Iterable[NoteCandidate], known_keys: Sequence[tuple[str, str]]
) -> list[NoteCandidate]:
    """The notes, each topic key that is a shown key but for case or surrounding space taken
    as the owner spells it: keys match exactly, and "Profile/City" for "profile/city" would
    be a second note of the fact (a keyed note, so dedupe would never merge the two)."""
    spelling = {key.strip().casefold(): key for key, _ in known_keys}
    spelled = []
    for note in notes:
        key = note.topic_key
        known = spelling.get(key.strip().casefold()) if key else None
        same = known is None or known == key
        spelled.append(note if same else note.model_copy(update={"topic_key": known}))
    return spelled


def merge_notes(notes: Iterable[NoteCandidate], max_facts: int) -> list[NoteCandidate]:
    """Deduplicate notes of one title (normalized) that hold one fact, keeping the most
    confident; sort by confidence (highest first, ties in order of appearance) and keep at
    most ``max_facts``.

    Two notes of one title whose titles or bodies disagree (``store.notes.judge.contradiction``:
    "Editor preference" as Vim for Python and as VS Code for TypeScript, or "Uses C++" and
    "Uses C#") are both kept: the title alone does not make them one fact, and the store's
    same-fact rule then judges each as it judges notes from two conversations.
    """
    kept: list[NoteCandidate] = []
    by_title: dict[str, list[int]] = {}  # normalized title -> its notes' places in kept
    for note in notes:
        same_title = by_title.setdefault(_title_key(note.title) or note.title, [])
        twin = next(
            (i for i in same_title if judge.contradiction(_fact(kept[i]), _fact(note)) is None),
            None,
        )
        if twin is None:
            same_title.append(len(kept))
            kept.append(note)
        elif note.confidence > kept[twin].confidence:
            kept[twin] = note
    ranked = sorted(kept, key=lambda n: -n.confidence)
    return ranked[:max_facts]


def _fact(note: NoteCandidate) -> FactText:
    return FactText(title=note.title, body=note.body)
