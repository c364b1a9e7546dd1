"""The README cannot drift from the code: every flag it names exists in `radixrt serve --help`,
every endpoint it names is served, every make target exists, and its Python examples call only
what the API has (attributes of radixrt, the Engine, SamplingParams fields, gen/select options)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import radixrt
from radixrt.cli import build_parser
from radixrt.runtime.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# everything a user of the runtime reads, before the tests' and the benchmarks' own commands
USER_PART = README[: README.index("\n## Tests")]
OTHER_COMMANDS_FLAGS = {"--no-deps", "--help"}  # pip's, and every command's


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def command_flags(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
               if hasattr(a, "choices"))
    return {opt for action in sub.choices[command]._actions for opt in action.option_strings}


def serve_flags() -> set[str]:
    return command_flags("serve")


def test_every_flag_the_readme_names_exists() -> None:
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", USER_PART))
    assert len(named) >= 20
    known = serve_flags() | command_flags("plan") | OTHER_COMMANDS_FLAGS
    missing = sorted(named - known)
    assert not missing, f"the README names flags radixrt serve / plan do not have: {missing}"


def test_every_make_target_the_readme_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    named = set(re.findall(r"`make ([a-z][a-z-]*)", README)) | set(
        re.findall(r"^make ([a-z][a-z-]*)", "\n".join(blocks("bash")), flags=re.M))
    assert named and named <= targets, sorted(named - targets)


def test_every_endpoint_the_readme_names_is_served(loaded_model: Any) -> None:
    from radixrt import Engine
    from radixrt.runtime.engine_manager import EngineManager
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=256)
    app = create_app(EngineManager(engine, model_name="default"))
    served = {(method, route.path) for route in app.routes
              for method in getattr(route, "methods", ())}
    named = set(re.findall(r"`(GET|POST) (/[a-z0-9_/]*)", README))
    assert len(named) >= 10
    missing = sorted(named - served)
    assert not missing, f"the README names endpoints that are not served: {missing}"


def python_examples() -> list[ast.Module]:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    return [compile(code, "README.md", "exec", flags=flags) for code in blocks("python")]


def test_the_python_examples_parse() -> None:
    assert len(python_examples()) >= 3


@pytest.mark.parametrize("module", ["rx", "radixrt"])
def test_the_python_examples_use_only_what_radixrt_has(module: str) -> None:
    used = {node.attr for tree in python_examples() for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == module}
    missing = sorted(a for a in used if not hasattr(radixrt, a))
    assert not missing, f"the README uses {module}.{missing}, which radixrt does not have"


def test_the_engine_and_sampling_calls_in_the_examples_exist() -> None:
    from radixrt import Engine

    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    for tree in python_examples():
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


def test_the_shell_examples_use_real_flags() -> None:
    for line in "\n".join(blocks("bash")).splitlines():
        for command in ("serve", "plan"):
            if f"radixrt {command}" in line:
                flags = command_flags(command)
                for flag in re.findall(r"(--[a-z][a-z0-9-]+)", line.split("#", 1)[0]):
                    assert flag in flags, line


def test_the_models_table_is_the_registry() -> None:
    """Every architecture the registry serves has a row, every row's architecture is served,
    and the family files and tests the table names exist."""
    from radixrt.runtime.models.registry import supported_architectures

    section = README[README.index("\n## Models\n"): README.index("\n## Operating the server")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {arch for row in rows for arch in re.findall(r"`(\w+For\w+)`", row.split("|")[1])}
    assert named == set(supported_architectures())
    for row in rows:
        cells = row.split("|")
        assert (ROOT / "radixrt/runtime/models/families" / cells[2].strip(" `")).is_file(), row
        for test in re.findall(r"`(test_\w+\.py)", cells[-2]):
            assert (ROOT / "tests" / test).is_file(), (row, test)
