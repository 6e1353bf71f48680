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
# Store modules no code outside store may import (see store/__init__.py).
STORE_INTERNAL = frozenset(
    {
        "api",
        "config",
        "config_embed",
        "dedupe",
        "dedupe_run",
        "dedupe_settle",
        "drafts",
        "export_records",
        "fact_terms",
        "forget_conversation",
        "fusion",
        "housekeeping",
        "job_intake",
        "keepers",
        "locks",
        "mem",
        "migrations",
        "models",
        "orm_base",
        "overlap",
        "records",
        "restore_check",
        "search_index",
        "search_sql",
        "sessions",
        "sql",
        "supersede",
        "tables",
        "tending",
        "term_index",
        "term_lookup",
        "write_item",
        "write_lookup",
        "write_plan",
        "writer",
    }
)
# Which of our packages each package may import (besides itself).
# privacy (the <private> and secrets strip) sits at the bottom: every package may use it.
MAY_IMPORT = {
    "privacy": set(),
    "store": {"privacy"},
    "harvest": {"store", "privacy"},
    "workers": {"harvest", "store", "privacy", "beat_schedule"},
    # The command line (cli) sits on top: it may use every layer.
    "cli": {"workers", "harvest", "store", "privacy", "gleaner", "service", "beat_schedule"},
    "gleaner": {"workers", "harvest", "store", "privacy"},
    "service": {"gleaner", "privacy"},
    "bench": {"cli", "workers", "harvest", "store", "privacy", "gleaner", "service", "tests"},
}
OURS = frozenset(MAY_IMPORT) | {"tests", "beat_schedule"}
# Outside libraries a package must not use: harvest never runs Celery.
NEVER = {
    "harvest": {"celery", "kombu"},
    "store": {"celery", "kombu", "litellm", "httpx"},
    "privacy": {"celery", "kombu", "litellm", "httpx", "sqlalchemy"},
}
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


# --- no import cycles, no long modules --------------------------------------------------

# Our source packages: their modules may not import one another in a cycle, nor run long.
SOURCE = ("privacy", "store", "harvest", "workers", "service", "gleaner", "cli")
MAX_LINES = 400


def our_modules() -> dict[str, Path]:
    """Each module of the source packages (and ``beat_schedule``) by its dotted name."""
    found = {}
    for top in SOURCE:
        folder = ROOT / top
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else ():
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    if (ROOT / "beat_schedule.py").is_file():
        found["beat_schedule"] = ROOT / "beat_schedule.py"
    return found


def import_graph() -> dict[str, set[str]]:
    """Which of our modules each one imports, anywhere in it (a function's imports count)."""
    modules = our_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, module, names in imports(path):
            # `from harvest import job` imports harvest and the module harvest.job.
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
            "harvest/__init__.py": "",
            "harvest/a.py": "def f():\n    from harvest.b import g\n",
            "harvest/b.py": "from harvest import a\n",
            "harvest/c.py": "import harvest.a\n",
        },
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert cycle_problems() == ["2 modules import one another: harvest.a -> harvest.b -> harvest.a"]


def test_the_length_check_finds_a_long_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule can fail: a module of 401 lines is named; a migration of any length is not."""
    _fake_tree(
        tmp_path,
        {
            "service/long.py": "x = 1\n" * 401,
            "service/short.py": "x = 1\n" * 400,
            "store/migrations/versions/0001_big.py": "x = 1\n" * 900,
        },
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert long_modules() == ["service/long.py: 401 lines, over 400: split it by concern"]
