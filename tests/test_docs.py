"""The README and the documentation site (docs/, mkdocs.yml) document what the code has.

The site's generated parts (docs/hooks.py: the configuration reference from the settings,
the HTTP reference from the OpenAPI schema, the benchmark targets from BENCHMARKS.md) are
rendered here without MkDocs; CI builds the whole site with ``mkdocs build --strict``, which
fails on a broken link or anchor.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest

from gleaner.store.settings import (
    COMMAND_VARIABLES,
    ENV_PREFIX,
    FILE_SETTINGS,
    TOOLING_PREFIXES,
    Settings,
)
from tests.cli_harness import Cli, cli

__all__ = ["cli"]  # the fixture, used by name

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
PAGES = sorted(DOCS.rglob("*.md"))


def page(name: str) -> str:
    return (DOCS / name).read_text()


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- README: one page --------------------------------------------------------------------


def test_readme_is_one_page() -> None:
    assert len(README.splitlines()) <= 150


def test_ci_runs_the_readme_test_command() -> None:
    # The command shown under "**The tests**" is the one CI runs.
    shown = re.search(r"\*\*The tests\*\*.*?\n\n {4}([^\n]+)\n", README, re.DOTALL)
    assert shown is not None
    command = shown.group(1).strip()
    assert command == "python -m pytest"
    assert re.search(rf"^{re.escape(command)}$", CI, re.MULTILINE)


def test_ci_builds_the_docs_strict() -> None:
    assert re.search(r"^mkdocs build --strict --site-dir ", CI, re.MULTILINE)
    assert "[docs]" in CI or "docs]" in CI
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", config, re.MULTILINE)
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_fast_tier_command_names_a_real_marker() -> None:
    assert 'python -m pytest -m "not slow" -n auto' in README
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"slow: ' in pyproject
    assert "pytest-xdist" in pyproject


def test_readme_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).is_file(), link


def test_readme_python_example_names_real_methods() -> None:
    from gleaner import Gleaner

    called = set(re.findall(r"\bg\.(\w+)\(", README))
    assert called >= {"submit", "job", "search", "index_text", "forget"}
    for name in called:
        assert callable(getattr(Gleaner, name, None)), name


def test_readme_mcp_tools_are_the_servers() -> None:
    source = (ROOT / "gleaner" / "service" / "mcp.py").read_text()
    served = set(re.findall(r"@server\.tool\(\)\s+def (\w+)\(", source))
    named = set(re.findall(r"`(mem_\w+)`", README))
    assert named == served


def test_readme_http_routes_exist() -> None:
    routes = set(hooks().openapi_schema()["paths"])
    for path in re.findall(r"localhost:8000(/v1/[^\s?\"]+)", README):
        template = re.sub(r"/owners/[^/]+", "/owners/{owner}", path)
        assert template in routes, path


# --- documented commands ------------------------------------------------------------------

PLACEHOLDER = re.compile(r"[|\[\]<>…]|\.\.\.")


def documented_commands(text: str) -> list[str]:
    """``gleaner ...`` lines of the code blocks (indented or fenced) of a Markdown text,
    each split at ``&&``, comments dropped; lines with alternatives or elisions left out."""
    commands = []
    fenced = False
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():  # continued lines joined
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            continue
        for part in line.split("#", 1)[0].split("&&"):
            command = part.strip()
            if command.startswith("gleaner ") and not PLACEHOLDER.search(command):
                commands.append(command)
    return commands


def test_documented_commands_parse() -> None:
    from gleaner.cli import build_parser

    parser = build_parser()
    seen = 0
    for source in [ROOT / "README.md", *PAGES]:
        for command in documented_commands(source.read_text()):
            argv = shlex.split(command)[1:]
            try:
                args, extra = parser.parse_known_args(argv)
            except SystemExit:
                pytest.fail(f"{source.name}: {command}")
            assert callable(args.func), command
            if argv[0] != "worker":  # only `worker` hands options on (to celery worker)
                assert extra == [], (source.name, command, extra)
            seen += 1
    assert seen >= 40


def test_every_command_is_in_the_cli_reference() -> None:
    commands = dict(hooks().cli_commands())
    for name in ("gleaner db upgrade", "gleaner harvest", "gleaner keys create", "gleaner eval"):
        assert name in commands
    reference = hooks().cli_reference()
    for name, text in commands.items():
        assert text, f"{name} has no help line"
        assert f"| `{name}` |" in reference
    assert "<!-- gleaner:cli -->" in page("cli.md")


def test_readme_main_job_is_documented_in_the_quickstart() -> None:
    main_job = (
        "gleaner db upgrade && gleaner harvest examples --owner alice && "
        "gleaner search --owner alice postgres"
    )
    assert main_job in README
    assert main_job in page("quickstart.md")
    assert (ROOT / "examples").is_dir()


def test_the_readme_main_job_runs_on_the_embedded_default(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # No GLEANER_* set: the SQLite file in the data directory, in process, offline.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    line = re.search(r"^ {4}(gleaner db upgrade && .+)$", README, re.MULTILINE)
    assert line is not None
    for command in line.group(1).split("&&"):
        argv = [str(ROOT / a) if a == "examples" else a for a in shlex.split(command)[1:]]
        ran = cli(*argv)
        assert ran.code == 0, (command, ran.err)
    assert (tmp_path / "data" / "gleaner" / "gleaner.db").is_file()
    # The last command, search, found notes (and said when each fact was said).
    assert "no notes match" not in ran.out
    assert "Postgres" in ran.out and "(said " in ran.out, ran.out


# --- the quickstart -----------------------------------------------------------------------


def test_quickstart_says_what_the_offline_harvester_catches() -> None:
    text = " ".join(page("quickstart.md").split())
    assert "explicit cues only" in text
    assert "190 notes from 272 twenty-turn sessions" in text
    for name in ("harvest_model", "harvest_api_base", "harvest_api_key"):
        assert name in Settings.model_fields
        assert f"GLEANER_{name.upper()}" in text


# --- configuration reference --------------------------------------------------------------


def test_every_setting_is_in_the_generated_reference() -> None:
    reference = hooks().settings_reference()
    for name in Settings.model_fields:
        assert f"| `{ENV_PREFIX}{name.upper()}` |" in reference, name
    assert "<!-- gleaner:settings -->" in page("reference/configuration.md")


def test_every_default_in_the_settings_reference_is_the_codes() -> None:
    # A row is what an operator sizes a deployment by: `unset` is None, a list is written
    # comma-separated, a secret's default is no value at all.
    rows = re.findall(
        r"^\| `GLEANER_([A-Z_]+)` \| [^|]+ \| (unset|`[^`]*`) \|",
        hooks().settings_reference(),
        re.MULTILINE,
    )
    assert len(rows) == len(Settings.model_fields)
    for name, written in rows:
        default = Settings.model_fields[name.lower()].default
        if written == "unset":
            assert default is None, name
            continue
        value = written.strip("`")
        if isinstance(default, tuple):
            assert ",".join(default) == value, name
        elif isinstance(default, bool):
            assert str(default).lower() == value, name
        elif isinstance(default, int | float):
            assert float(value) == default, name
        else:
            assert str(default) == value, name


def test_every_setting_has_its_description_in_the_reference() -> None:
    reference = hooks().settings_reference()
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no Field description"
        written = field.description.strip().replace("<", "&lt;").replace("|", "\\|")
        assert written in reference, name


def test_the_settings_details_name_only_settings() -> None:
    details = re.findall(
        r"^- \*\*`GLEANER_([A-Z_]+)`\*\*", page("reference/configuration.md"), re.MULTILINE
    )
    assert details
    assert len(details) == len(set(details))
    assert set(details) <= {name.upper() for name in Settings.model_fields}


def test_every_gleaner_variable_the_docs_name_exists() -> None:
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    known |= {f"{ENV_PREFIX}{name.upper()}_FILE" for name in FILE_SETTINGS}
    known |= set(COMMAND_VARIABLES)
    known.add("GLEANER_BROKR_URL")  # the misspelling the configuration page shows a warning for
    for source in [ROOT / "README.md", *PAGES]:
        for name in re.findall(r"\bGLEANER_[A-Z0-9_]*[A-Z0-9]\b", source.read_text()):
            if name.startswith(TOOLING_PREFIXES) or f"{name}_" in TOOLING_PREFIXES:
                continue
            assert name in known, f"{source.name} names {name}, which no setting reads"


# --- HTTP reference -----------------------------------------------------------------------


def test_every_route_is_in_the_http_reference_and_the_guide() -> None:
    schema = hooks().openapi_schema()
    reference = hooks().http_reference(schema)
    guide = page("http.md")
    assert schema["paths"]
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"### `{method.upper()} {path}`" in reference
            if path.startswith("/v1/"):
                assert f"`{method.upper()} {path}" in guide, (method, path)
    assert "<!-- gleaner:http -->" in page("reference/http.md")


# --- site structure -----------------------------------------------------------------------


def test_every_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r":\s+(\S+\.md)\s*$", config, re.MULTILINE))
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert pages == nav


def test_root_documents_are_included_in_the_site() -> None:
    for name, included in (
        ("contributing.md", "CONTRIBUTING.md"),
        ("changelog.md", "CHANGELOG.md"),
        ("benchmarks-run.md", "BENCHMARKS.md"),
    ):
        assert f'--8<-- "{included}"' in page(name)
        assert (ROOT / included).is_file()


def test_benchmark_summary_is_one_page() -> None:
    assert len(page("benchmarks.md").splitlines()) <= 150
    targets = hooks().benchmark_targets()
    assert targets.count("\n") > 10, targets
    assert "<!-- gleaner:benchmark-targets -->" in page("benchmarks.md")


def test_reliability_report_anchors_are_the_sites() -> None:
    # The report links each scenario by its heading's anchor; the site must make the same.
    slugs = pytest.importorskip("pymdownx.slugs")
    from tests.reliability.report import _anchor

    slugify = slugs.slugify(case="lower")
    report = page("RELIABILITY.md")
    headings = re.findall(r"^### (\d+)\. (.+)$", report, re.MULTILINE)
    assert headings
    for number, title in headings:
        assert f"{number}-{_anchor(title)}" == slugify(f"{number}. {title}", "-")
        assert f"(#{number}-{_anchor(title)})" in report


def test_reliability_report_links_resolve_in_the_site() -> None:
    # docs/RELIABILITY.md is generated (tests/reliability/report.py): its links are the site's.
    from tests.reliability.report import render

    scenario = {"title": "kill -9 of the whole worker mid-run", "name": "test_kill"}
    rendered = render({"run": {}, "scenarios": [{**scenario, "outcome": "passed"}]})
    for text in (rendered, page("RELIABILITY.md")):
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
        assert links
        for link in links:
            assert (DOCS / link).is_file(), link
    assert "(#1-kill--9-of-the-whole-worker-mid-run)" in rendered
    assert "### 1. kill -9 of the whole worker mid-run" in rendered


def test_the_architecture_page_lists_every_module_with_what_it_holds(tmp_path: Path) -> None:
    """The module list is generated from the source, so it names each module as it is; a
    module without a docstring would show an empty row, and is refused here."""
    reference = hooks().module_reference()
    for package in hooks().PACKAGES:
        for path in hooks().package_modules(package):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            assert hooks().module_summary(path), f"{name} has no docstring"
            assert f"| `{name}` |" in reference
    # The check can fail: a package with an undocumented module is caught.
    (tmp_path / "privacy").mkdir()
    (tmp_path / "privacy" / "bare.py").write_text("X = 1\n")
    assert hooks().module_summary(tmp_path / "privacy" / "bare.py") == ""
