"""The documentation site's generated parts, rendered by ``mkdocs build`` (a MkDocs hook).

Pages hold markers that this replaces with text made from the code, so they cannot drift
from it:

- ``<!-- gleaner:settings -->`` (reference/configuration.md): one row per field of
  ``gleaner.config.Settings``, part by part, from its type, default, bounds and ``Field``
  description;
- ``<!-- gleaner:http -->`` (reference/http.md): every route of ``service.http.create_app``'s
  OpenAPI schema, whose JSON is also published as ``reference/openapi.json``;
- ``<!-- gleaner:cli -->`` (cli.md): every ``gleaner`` command with its help line, from the
  CLI's own parser;
- ``<!-- gleaner:benchmark-targets -->`` (benchmarks.md): the rows of the last full run
  (BENCHMARKS.md) that have a target;
- ``<!-- gleaner:modules -->`` (architecture.md): every module of each package with the first
  sentence of its docstring, read from the source (nothing is imported).

``tests/test_docs.py`` calls the two renderers directly; CI builds the site with ``--strict``.
"""

from __future__ import annotations

import ast
import json
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SETTINGS_MARKER = "<!-- gleaner:settings -->"
HTTP_MARKER = "<!-- gleaner:http -->"
BENCHMARK_MARKER = "<!-- gleaner:benchmark-targets -->"
CLI_MARKER = "<!-- gleaner:cli -->"
MODULES_MARKER = "<!-- gleaner:modules -->"
# Bottom to top, as the layering runs.
PACKAGES = ("privacy", "config", "store", "harvest", "workers", "gleaner", "service", "cli")
OPENAPI_URI = "reference/openapi.json"


def _escape(text: str) -> str:
    """``<`` outside code spans as an entity, so ``<private>`` is read as text, not HTML."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


# --- settings -------------------------------------------------------------------------------


def _type_text(annotation: Any) -> str:
    """A setting's type as an operator writes it in the environment."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type_text(a) for a in kept)
    if origin is tuple:
        return "comma-separated list"
    name = getattr(annotation, "__name__", str(annotation))
    return {
        "str": "text",
        "int": "integer",
        "float": "number",
        "bool": "`true` or `false`",
        "SecretStr": "secret text",
    }.get(name, name)


def _default_text(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, tuple):
        return "`" + ",".join(str(d) for d in default) + "`"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def _bounds_text(metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if value is not None:
                words.append(f"{sign} {value}")
        if getattr(item, "max_length", None) is not None:
            words.append(f"at most {item.max_length} characters")
    return ", ".join(words)


# Each part of the settings (gleaner.config.PARTS) under the heading of what reads it.
PART_TITLES = {
    "StoreSettings": "Store",
    "HarvestSettings": "Harvest",
    "EmbedSettings": "Semantic recall (embeddings)",
    "WorkerSettings": "Workers",
    "ServiceSettings": "HTTP service",
    "CommandSettings": "Command line",
}


def settings_rows(part: Any = None) -> list[tuple[str, str, str, str, str]]:
    """(variable, type, default, bounds, description) for every setting of ``part`` (a
    ``gleaner.config`` part; None: all of them), in the code's order."""
    from gleaner.config import Settings
    from gleaner.store.settings import ENV_PREFIX, FILE_SETTINGS

    rows = []
    for name, field in (part or Settings).model_fields.items():
        description = (field.description or "").strip()
        if name in FILE_SETTINGS:
            description += f" Or `{ENV_PREFIX}{name.upper()}_FILE`: a file holding the value."
        rows.append(
            (
                f"{ENV_PREFIX}{name.upper()}",
                _type_text(field.annotation),
                _default_text(field.default),
                _bounds_text(field.metadata),
                description,
            )
        )
    return rows


def settings_reference() -> str:
    """The configuration reference's tables (Markdown), one per part of the settings, each
    under the name of what reads it and the module that declares it."""
    from gleaner.config import PARTS

    lines = []
    for part in PARTS:
        module = part.__module__.replace(".", "/") + ".py"
        lines += [f"### {PART_TITLES[part.__name__]}", "", f"Declared in `{module}`.", ""]
        lines += ["| variable | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for variable, kind, default, bounds, description in settings_rows(part):
            cell = _escape(description).replace("|", "\\|")
            lines.append(f"| `{variable}` | {kind} | {default} | {bounds or '-'} | {cell} |")
        lines.append("")
    return "\n".join(lines)


# --- HTTP -----------------------------------------------------------------------------------


def openapi_schema() -> dict[str, Any]:
    """The HTTP service's OpenAPI schema, built as ``gleaner serve`` builds its app (no
    database is opened: building the app reads only the settings)."""
    from gleaner.service.http import create_app
    from gleaner.store.settings import Settings

    gleaner = types.SimpleNamespace(settings=Settings(database_url="sqlite://"))
    return create_app(gleaner).openapi()  # type: ignore[arg-type]


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "`" + schema["$ref"].rsplit("/", 1)[-1] + "`"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    return str(kind)


def http_reference(schema: dict[str, Any] | None = None) -> str:
    """One section per route of the OpenAPI schema: summary, description, parameters and
    the answers it documents (Markdown)."""
    schema = schema or openapi_schema()
    lines: list[str] = []
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            lines += [f"### `{method.upper()} {path}`", ""]
            if op.get("description"):
                lines += [_escape(" ".join(op["description"].split())), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    meaning = _escape(" ".join((p.get("description") or "").split()))
                    meaning = meaning.replace("|", "\\|")
                    required = "yes" if p.get("required") else "no"
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema', {}))} | "
                        f"{required} | {meaning or '-'} |"
                    )
                lines.append("")
            if "requestBody" in op:
                kinds = ", ".join(f"`{k}`" for k in op["requestBody"].get("content", {}))
                lines += [f"Body: {kinds or 'any'}.", ""]
            answers = ", ".join(
                f"{code} ({' '.join((r.get('description') or '').split())})"
                for code, r in op.get("responses", {}).items()
            )
            lines += [f"Answers: {answers}.", ""]
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------


def cli_commands() -> list[tuple[str, str]]:
    """(command, help) for every ``gleaner`` command, as the CLI's parser declares them."""
    import argparse

    from gleaner.cli import build_parser

    found: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    walk(sub, [*prefix, name])
                else:
                    found.append((" ".join([*prefix, name]), helps.get(name, "")))

    walk(build_parser(), ["gleaner"])
    return found


def cli_reference() -> str:
    """The commands' table (Markdown)."""
    lines = ["| command | does |", "|---|---|"]
    for command, text in cli_commands():
        cell = text.replace("|", "\\|")
        lines.append(f"| `{command}` | {cell} |")
    return "\n".join(lines) + "\n"


# --- benchmarks -----------------------------------------------------------------------------


def benchmark_targets(report: str | None = None) -> str:
    """The rows of the last full run (BENCHMARKS.md, written by ``python -m bench``) that have
    a target, as a table (Markdown)."""
    if report is None:
        report = (ROOT / "BENCHMARKS.md").read_text()
    lines = ["| scenario | metric | value | target | met |", "|---|---|---|---|---|"]
    parent = ""
    for line in report.splitlines():
        raw = line.strip().strip("|").split("|")
        cells = [c.strip() for c in raw]
        if len(cells) != 7 or cells[0] in ("scenario", "---"):
            continue
        scenario, metric, value, _ceiling, _ratio, target, met = cells
        if raw[1].startswith("   "):  # a sub-row (indented) says more about the row above
            metric = f"{parent}: {metric}"
        else:
            parent = metric
        if target:
            lines.append(f"| {scenario} | {_escape(metric)} | {value} | {target} | {met} |")
    return "\n".join(lines) + "\n"


# --- modules --------------------------------------------------------------------------------


def module_summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def package_folder(package: str) -> str:
    """Where a layer's modules are: gleaner/*.py is the public API's own layer, each
    sub-package of gleaner another."""
    return "gleaner" if package == "gleaner" else f"gleaner/{package}"


def package_modules(package: str, root: Path = ROOT) -> list[Path]:
    """A layer's modules, migrations aside."""
    folder = root / package_folder(package)
    found = folder.glob("*.py") if package == "gleaner" else folder.rglob("*.py")
    return sorted(path for path in found if "migrations" not in path.parts)


def module_reference(root: Path = ROOT) -> str:
    """One table per package, bottom layer first: each module and what it holds."""
    out: list[str] = []
    for package in PACKAGES:
        heading = f"### `{package_folder(package)}/`"
        out += [heading, "", "| module | what it holds |", "|---|---|"]
        for path in package_modules(package, root):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            name = name.removesuffix(".__init__")
            out.append(f"| `{name}` | {_escape(module_summary(path)).replace('|', '&#124;')} |")
        out.append("")
    return "\n".join(out)


# --- MkDocs events --------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Publish the OpenAPI schema beside the HTTP reference."""
    from mkdocs.structure.files import File

    content = json.dumps(openapi_schema(), indent=2, sort_keys=True) + "\n"
    files.append(File.generated(config, OPENAPI_URI, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker with the text generated from the code."""
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if BENCHMARK_MARKER in markdown:
        markdown = markdown.replace(BENCHMARK_MARKER, benchmark_targets())
    if MODULES_MARKER in markdown:
        markdown = markdown.replace(MODULES_MARKER, module_reference())
    if HTTP_MARKER in markdown:
        markdown = markdown.replace(HTTP_MARKER, http_reference())
    return markdown
