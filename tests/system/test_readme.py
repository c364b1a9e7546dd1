"""The README and the pages under docs/ cannot drift from the code: every flag a page names exists
in `radixrt serve --help` (or `radixrt plan`'s, or those of a benchmark script the page names),
every endpoint it names is served, every make target exists, its Python examples call only what
the API has (attributes of radixrt, the Engine, SamplingParams fields, gen/select options), its
relative links and anchors resolve, the Models table is the registry, and the README stays
short."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import radixrt
from radixrt.cli import build_parser
from radixrt.runtime.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [page.relative_to(ROOT).as_posix() for page in PAGES]
README_MAX_LINES = 400
# flags of other commands the pages show: pip's, every command's --help, llama.cpp's
# llama-server (the benchmarks' peer), helm's (docs/kubernetes.md)
OTHER_COMMANDS_FLAGS = {"--no-deps", "--help", "--jinja", "--spec-type", "--set",
                        "--durations", "--dist"}  # pip's, llama-server's, helm's, pytest's
MODELS_TABLE_HEADER = "| architecture (`config.json`) |"

each_page = pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)


@functools.cache
def text_of(page: Path) -> str:
    return page.read_text()


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def named_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", text))


def command_flags(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
               if hasattr(a, "choices"))
    return {opt for action in sub.choices[command]._actions for opt in action.option_strings}


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@functools.cache
def script_flags(folder: str, script: str) -> frozenset[str]:
    """The flags of <folder>/<script>.py (benchmarks/, scripts/), from the parser its parse_args
    builds (a helper module without one has none of its own)."""
    if str(ROOT / folder) not in sys.path:  # the scripts import each other by name
        sys.path.insert(0, str(ROOT / folder))
    module = importlib.import_module(script)
    if not hasattr(module, "parse_args"):
        return frozenset()

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            module.parse_args([])
        except _Parsed as parsed:
            return frozenset(opt for action in parsed.parser._actions
                             for opt in action.option_strings)
    raise AssertionError(f"{folder}/{script}.py's parse_args parsed nothing")


def known_flags(text: str) -> set[str]:
    """radixrt serve's and plan's, other commands', and those of the benchmark scripts and
    scripts/ named."""
    known = command_flags("serve") | command_flags("plan") | OTHER_COMMANDS_FLAGS
    for folder, script in set(re.findall(r"(benchmarks|scripts)/(\w+)\.py", text)):
        known |= script_flags(folder, script)
    return known


@each_page
def test_every_flag_a_page_names_exists(page: Path) -> None:
    text = text_of(page)
    missing = sorted(named_flags(text) - known_flags(text))
    assert not missing, f"{page.name} names flags that radixrt serve / plan do not have: {missing}"


def test_the_pages_name_flags() -> None:
    assert len(set().union(*(named_flags(text_of(p)) for p in PAGES))) >= 20


@each_page
def test_every_make_target_a_page_names_exists(page: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    text = text_of(page)
    named = set(re.findall(r"`make ([a-z][a-z-]*)", text)) | set(
        re.findall(r"^make ([a-z][a-z-]*)", "\n".join(blocks(text, "bash")), flags=re.M))
    assert named <= targets, sorted(named - targets)


def test_the_readme_names_make_demo_and_make_test_first() -> None:
    readme = text_of(ROOT / "README.md")
    first = blocks(readme, "bash")[0]
    assert first.startswith("make demo") and "\nmake test " in first, first
    assert readme.index("make demo") < readme.index("\n## ")


def named_endpoints(text: str) -> set[tuple[str, str]]:
    """(method, path) of every `GET /...`, `POST /...` and `DELETE /...` a page names; a path
    parameter is written {}, whatever its name."""
    return {(method, path_shape(path)) for method, path in
            re.findall(r"`(GET|POST|DELETE) (/[a-z0-9_/.{}]*)", text)}


def path_shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


@pytest.fixture(scope="module")
def served(loaded_model: Any) -> set[tuple[str, str]]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=256)
    app = create_app(engine.tokenizer_manager("default"))
    return {(method, path_shape(route.path)) for route in app.routes
            for method in getattr(route, "methods", ())}


@each_page
def test_every_endpoint_a_page_names_is_served(page: Path, served: set[tuple[str, str]]) -> None:
    missing = sorted(named_endpoints(text_of(page)) - served)
    assert not missing, f"{page.name} names endpoints that are not served: {missing}"


def test_the_pages_name_endpoints() -> None:
    assert len(set().union(*(named_endpoints(text_of(p)) for p in PAGES))) >= 10


def python_examples(page: Path) -> list[ast.Module]:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    return [compile(code, page.name, "exec", flags=flags)
            for code in blocks(text_of(page), "python")]


@each_page
def test_the_python_examples_parse(page: Path) -> None:
    python_examples(page)


def test_the_readme_and_the_docs_have_python_examples() -> None:
    assert len(python_examples(ROOT / "README.md")) >= 3
    assert sum(len(python_examples(p)) for p in PAGES) >= 10


@each_page
@pytest.mark.parametrize("module", ["rx", "radixrt"])
def test_the_python_examples_use_only_what_radixrt_has(page: Path, module: str) -> None:
    used = {node.attr for tree in python_examples(page) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == module}
    missing = sorted(a for a in used if not hasattr(radixrt, a))
    assert not missing, f"{page.name} uses {module}.{missing}, which radixrt does not have"


@each_page
def test_the_engine_and_sampling_calls_in_the_examples_exist(page: Path) -> None:
    from radixrt import Engine

    fields = set(SamplingParams.__struct_fields__)
    for tree in python_examples(page):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "engine"):
                assert hasattr(Engine, node.attr), f"Engine.{node.attr} does not exist"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SamplingParams":
                for kw in node.keywords:
                    assert kw.arg in fields, f"SamplingParams has no field {kw.arg}"
            name = getattr(node.func, "attr", None) if isinstance(node, ast.Call) else None
            if name == "gen":  # gen options are SamplingParams fields or gen's own
                own = {p for p in inspect.signature(radixrt.gen).parameters if p != "sampling"}
                for kw in node.keywords:
                    assert kw.arg in fields | own, kw.arg


@each_page
def test_the_shell_examples_use_real_flags(page: Path) -> None:
    for line in "\n".join(blocks(text_of(page), "bash")).splitlines():
        for command in ("serve", "plan"):
            if f"radixrt {command}" in line:
                flags = command_flags(command)
                for flag in re.findall(r"(--[a-z][a-z0-9-]+)", line.split("#", 1)[0]):
                    assert flag in flags, line


def models_rows(text: str) -> list[str]:
    """The rows of the Models table (architecture, family file, ..., proved by), if any."""
    if MODELS_TABLE_HEADER not in text:
        return []
    table = text[text.index(MODELS_TABLE_HEADER):].split("\n\n", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| `")]


def test_the_models_table_is_the_registry() -> None:
    """Every architecture the registry serves has a row, every row's architecture is served,
    and the family files and tests the table names exist: in docs/models.md, and in any other
    page that shows the table."""
    from radixrt.runtime.models.registry import supported_architectures

    assert models_rows(text_of(ROOT / "docs/models.md")), "docs/models.md has no Models table"
    for page in PAGES:
        rows = models_rows(text_of(page))
        if not rows:
            continue
        named = {arch for row in rows for arch in re.findall(r"`(\w+For\w+)`", row.split("|")[1])}
        assert named == set(supported_architectures()), page.name
        for row in rows:
            cells = row.split("|")
            family = ROOT / "radixrt/runtime/models/families" / cells[2].strip(" `")
            assert family.is_file(), (page.name, row)
            for test in re.findall(r"`(test_\w+\.py)", cells[-2]):
                assert list((ROOT / "tests").rglob(test)), (page.name, row, test)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", text_of(page), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


@each_page
def test_every_relative_link_resolves(page: Path) -> None:
    """Links to files (docs pages, plots, source files) exist, and their anchors are headings."""
    text = re.sub(r"```.*?```", "", text_of(page), flags=re.S)
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links to {link}, which does not exist"
        if anchor:
            assert target.suffix == ".md", link
            assert anchor in anchors(target), f"{page.name} links to {link}: no such heading"


def test_every_plot_is_shown_somewhere() -> None:
    shown = "\n".join(text_of(p) for p in PAGES)
    for plot in sorted((ROOT / "docs/plots").glob("*.png")):
        assert f"plots/{plot.name})" in shown, f"docs/plots/{plot.name} is shown on no page"


def test_the_readme_is_short() -> None:
    lines = len(text_of(ROOT / "README.md").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail into docs/")
