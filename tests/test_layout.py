"""The layout holds: dependencies point one way, the store's internals stay inside it, the
HTTP and MCP services use only the public Python API, and no module imports another's
private name; no modules import one another in a cycle and none runs over 400 lines. Read
from the source (no import runs), so a violation fails here first."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Store modules (dotted under store) no code outside the store may import (see
# gleaner/store/__init__.py);
# a package named here is internal whole.
STORE_INTERNAL = frozenset(
    {
        "api",
        "housekeeping.dedupe",
        "housekeeping.dedupe_run",
        "housekeeping.dedupe_settle",
        "housekeeping.keepers",
        "housekeeping.state",
        "jobs.intake",
        "jobs.locks",
        "migrations",
        "notes.drafts",
        "notes.fact_terms",
        "notes.mem",
        "notes.overlap",
        "notes.supersede",
        "notes.tending",
        "notes.term_index",
        "notes.term_lookup",
        "notes.write_item",
        "notes.write_lookup",
        "notes.write_plan",
        "notes.writer",
        "owners.export_records",
        "owners.forget_conversation",
        "owners.restore_check",
        "recall.fusion",
        "recall.search_index",
        "recall.search_sql",
        "schema.models",
        "schema.orm_base",
        "schema.records",
        "schema.sql",
        "schema.tables",
        "sessions",
    }
)
# Which of our layers each layer may import (besides itself). A layer is a sub-package of
# gleaner (``store`` is "store"), or "gleaner", the public API's own modules
# (gleaner/*.py), or the repository's bench and tests.
# privacy (the <private> and secrets strip) sits at the bottom: every package may use it.
# config (each package's settings, composed) sits there too: declarations only.
BOTTOM = {"privacy", "config"}
MAY_IMPORT = {
    "privacy": set(),
    "config": set(),
    "store": BOTTOM,
    "harvest": {"store"} | BOTTOM,
    "workers": {"harvest", "store", "beat_schedule"} | BOTTOM,
    # The command line (cli) sits on top: it may use every layer.
    "cli": {"workers", "harvest", "store", "gleaner", "service", "beat_schedule"} | BOTTOM,
    "gleaner": {"workers", "harvest", "store"} | BOTTOM,
    "service": {"gleaner"} | BOTTOM,
    # The beat schedule is read by Celery beat and by workers.app: it names workers.tasks.
    "beat_schedule": {"workers", "harvest", "store"} | BOTTOM,
    "bench": {"cli", "workers", "harvest", "store", "gleaner", "service", "tests"} | BOTTOM,
}
SUBPACKAGES = frozenset(MAY_IMPORT) - {"gleaner", "bench"}
# Outside libraries a package must not use: harvest never runs Celery.
NEVER = {
    "harvest": {"celery", "kombu"},
    "store": {"celery", "kombu", "litellm", "httpx"},
    "privacy": {"celery", "kombu", "litellm", "httpx", "sqlalchemy"},
    "config": {"celery", "kombu", "litellm", "httpx", "sqlalchemy"},
}
# bench measures raw-table ceilings beside the store's own path: it may read the models, and
# loads its synthetic notes' search postings as a write computes them.
ALLOWED = {("bench", "store.schema.models"), ("bench", "store.recall.search_index")}


def layer(module: str) -> tuple[str | None, str]:
    """The layer a dotted module belongs to, and its name within gleaner
    (``gleaner.store.api`` is ``("store", "store.api")``); ``None`` for outside libraries."""
    parts = module.split(".")
    if parts[0] in {"bench", "tests"}:
        return parts[0], module
    if parts[0] != "gleaner":
        return None, module
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1], ".".join(parts[1:])
    return "gleaner", module


def layer_files(package: str, root: Path) -> list[Path]:
    """The source files of one layer."""
    if package in {"bench", "tests"}:
        return sorted((root / package).rglob("*.py"))
    if package == "gleaner":
        return sorted((root / "gleaner").glob("*.py"))
    if package == "beat_schedule":
        return [root / "gleaner" / "beat_schedule.py"]
    return sorted((root / "gleaner" / package).rglob("*.py"))


def imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Each ``(line, module, names)`` the file imports, relative imports resolved;
    ``from gleaner import store`` is read as an import of ``gleaner.store``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [alias.name for alias in node.names]
            if node.module == "gleaner":
                for name in [n for n in names if n in SUBPACKAGES]:
                    yield node.lineno, f"gleaner.{name}", []
                names = [n for n in names if n not in SUBPACKAGES]
                if not names:
                    continue
            yield node.lineno, node.module, names


def problems(package: str) -> list[str]:
    found = []
    for path in layer_files(package, ROOT):
        where = path.relative_to(ROOT)
        for line, module, names in imports(path):
            top, short = layer(module)
            if module.split(".")[0] in NEVER.get(package, ()):
                found.append(f"{where}:{line}: {package} imports {module}")
            if top is None or top == package:
                continue
            if top not in MAY_IMPORT[package]:
                found.append(f"{where}:{line}: {package} may not import {top} ({module})")
            if (package, short) in ALLOWED:
                continue
            parts = short.split(".")
            named = [f"{short}.{n}" for n in names] if top == "store" else []
            for target in [short, *named]:
                pieces = target.split(".")
                inside = [".".join(pieces[1:k]) for k in range(2, len(pieces) + 1)]
                if top == "store" and any(name in STORE_INTERNAL for name in inside):
                    found.append(f"{where}:{line}: store internal gleaner.{target}")
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
    (fake_root / "gleaner" / "harvest").mkdir(parents=True)
    (fake_root / "gleaner" / "harvest" / "bad.py").write_text(
        "from gleaner.store.notes.writer import write_items\nimport celery\n"
        "from gleaner.store.recall.search import _x\nfrom gleaner import workers\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", fake_root)
    found = problems("harvest")
    assert any("store internal gleaner.store.notes.writer" in p for p in found)
    assert any("may not import workers" in p for p in found)
    assert any("imports celery" in p for p in found)
    assert any("private name" in p for p in found)


# --- no import cycles, no long modules --------------------------------------------------

# The installed package's modules may not import one another in a cycle, nor run long.
MAX_LINES = 400


def our_modules() -> dict[str, Path]:
    """Each module of the gleaner package by its dotted name."""
    found = {}
    for path in sorted((ROOT / "gleaner").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Which of our modules each one imports, anywhere in it (a function's imports count)."""
    modules = our_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, module, names in imports(path):
            # `from gleaner.harvest import job` imports gleaner.harvest and gleaner.harvest.job.
            for target in (module, *(f"{module}.{n}" for n in names)):
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import one another, directly or through others: each strongly
    connected component of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import cycle through the component's first module, to show in a failure."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node] & members):
            if other == start:
                return [*paths[node], start]
            if other not in paths:
                paths[other] = [*paths[node], other]
                queue.append(other)
    return component


def cycle_problems() -> list[str]:
    graph = import_graph()
    return [
        f"{len(component)} modules import one another: " + " -> ".join(one_cycle(graph, component))
        for component in import_cycles(graph)
    ]


def long_modules() -> list[str]:
    found = []
    for path in our_modules().values():
        where = path.relative_to(ROOT)
        if "migrations" in where.parts:
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(
                f"{where.as_posix()}: {lines} lines, over {MAX_LINES}: split it by concern"
            )
    return found


def test_our_modules_import_no_cycle() -> None:
    assert cycle_problems() == []


def test_no_module_is_over_400_lines() -> None:
    assert long_modules() == []


def _fake_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cycle_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule can fail: two harvest modules that import each other (one inside a function,
    one through the package's name) are a cycle, and the message walks it."""
    _fake_tree(
        tmp_path,
        {
            "gleaner/harvest/__init__.py": "",
            "gleaner/harvest/a.py": "def f():\n    from gleaner.harvest.b import g\n",
            "gleaner/harvest/b.py": "from gleaner.harvest import a\n",
            "gleaner/harvest/c.py": "import gleaner.harvest.a\n",
        },
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert cycle_problems() == [
        "2 modules import one another: gleaner.harvest.a -> gleaner.harvest.b -> gleaner.harvest.a"
    ]


def test_the_length_check_finds_a_long_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule can fail: a module of 401 lines is named; a migration of any length is not."""
    _fake_tree(
        tmp_path,
        {
            "gleaner/service/long.py": "x = 1\n" * 401,
            "gleaner/service/short.py": "x = 1\n" * 400,
            "gleaner/store/migrations/versions/0001_big.py": "x = 1\n" * 900,
        },
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert long_modules() == ["gleaner/service/long.py: 401 lines, over 400: split it by concern"]
