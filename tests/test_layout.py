"""The layout holds: dependencies point one way, the store's internals stay inside it, the
HTTP and MCP services use only the public Python API, and no module imports another's
private name. Read from the source (no import runs), so a violation fails here first."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Store modules no code outside store may import (see store/__init__.py).
STORE_INTERNAL = frozenset(
    {
        "api",
        "dedupe",
        "drafts",
        "forget_conversation",
        "housekeeping",
        "locks",
        "mem",
        "migrations",
        "models",
        "overlap",
        "sql",
        "supersede",
        "tables",
        "tending",
        "search_index",
        "term_index",
        "write_item",
        "write_lookup",
        "write_plan",
        "writer",
    }
)
# Which of our packages each package may import (besides itself).
MAY_IMPORT = {
    "store": set(),
    "harvest": {"store"},
    "workers": {"harvest", "store", "beat_schedule"},
    # The command line (workers/cli) sits on top: it may use every layer.
    "workers.cli": {"workers", "harvest", "store", "gleaner", "service", "beat_schedule"},
    "gleaner": {"workers", "harvest", "store"},
    "service": {"gleaner"},
    "bench": {"workers", "harvest", "store", "gleaner", "service", "tests"},
}
OURS = frozenset(MAY_IMPORT) - {"workers.cli"} | {"tests", "beat_schedule"}
# Outside libraries a package must not use: harvest never runs Celery.
NEVER = {"harvest": {"celery", "kombu"}, "store": {"celery", "kombu", "litellm", "httpx"}}
# bench measures raw-table ceilings beside the store's own path: it may read the models, and
# loads its synthetic notes' search postings as a write computes them.
ALLOWED = {("bench", "store.models"), ("bench", "store.search_index")}


def imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Each ``(line, module, names)`` the file imports, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def problems(package: str) -> list[str]:
    found = []
    folder = ROOT.joinpath(*package.split("."))
    for path in sorted(folder.rglob("*.py")):
        if package == "workers" and "cli" in path.relative_to(folder).parts:
            continue  # checked as workers.cli
        where = path.relative_to(ROOT)
        for line, module, names in imports(path):
            top = module.split(".")[0]
            if top in NEVER.get(package, ()):
                found.append(f"{where}:{line}: {package} imports {module}")
            if top not in OURS or top == package.split(".", maxsplit=1)[0]:
                continue
            if top not in MAY_IMPORT[package]:
                found.append(f"{where}:{line}: {package} may not import {top} ({module})")
            if (package, module) in ALLOWED:
                continue
            parts = module.split(".")
            named = [f"{module}.{n}" for n in names] if module == "store" else []
            for target in [module, *named]:
                pieces = target.split(".")
                if pieces[0] == "store" and len(pieces) > 1 and pieces[1] in STORE_INTERNAL:
                    found.append(f"{where}:{line}: store internal {target}")
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private or any(p.startswith("_") and p != "__main__" for p in parts[1:]):
                found.append(f"{where}:{line}: private name from {module}: {private}")
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_package_imports_follow_the_layout(package: str) -> None:
    assert problems(package) == []


def test_the_check_finds_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule can fail: a harvest module reaching into the writer and Celery is caught."""
    fake_root = tmp_path
    (fake_root / "harvest").mkdir()
    (fake_root / "harvest" / "bad.py").write_text(
        "from store.writer import write_items\nimport celery\nfrom store.search import _x\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", fake_root)
    found = problems("harvest")
    assert any("store internal store.writer" in p for p in found)
    assert any("imports celery" in p for p in found)
    assert any("private name" in p for p in found)
