"""The package's shape: every import inside radixrt/ points down the layer order, no modules
import each other in a circle (inside one layer either), every module's file name is unique, and
config.py holds only the constants two or more modules share.

Layer order, top to bottom (README and docs/architecture.md): cli -> launcher -> server -> engine ->
tokenizer -> scheduler -> worker -> constrained -> models -> forward -> kernels. The ground
(config, server_options, messages, errors, sampling_params, pooling_params, outputs, ipc, helper
processes, distributed) stands beneath every layer and imports only itself. The DSL frontend has
layers of its own: its public API (radixrt.frontend) -> backends (where programs run) -> lang
(the DSL, which knows no backend); it stands on nothing of the runtime but its wire messages and
constants (and never torch). An import within one layer is allowed, as long as it closes no
circle.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "radixrt"
REPO = ROOT.parent

LAYERS = [  # (layer name, module prefixes), top to bottom
    ("cli", ["radixrt", "radixrt.__main__", "radixrt.cli", "radixrt.plan_cli",
             "radixrt.config_flags",
             "radixrt.lang"]),  # the public API's `sglang.lang.ir` path (radixrt.lang.ir)
    ("launcher", ["radixrt.runtime.launcher", "radixrt.runtime.replicas"]),
    ("server", ["radixrt.runtime.server"]),
    ("engine", ["radixrt.runtime.engine", "radixrt.runtime.engine_link"]),
    ("tokenizer", ["radixrt.runtime.tokenizer"]),
    ("scheduler", ["radixrt.runtime.scheduler"]),
    ("worker", ["radixrt.runtime.worker"]),
    ("constrained", ["radixrt.runtime.constrained"]),
    ("models", ["radixrt.runtime.models"]),
    ("forward", ["radixrt.runtime.forward"]),
    ("kernels", ["radixrt.kernels"]),
]
GROUND = [
    "radixrt.runtime.config",
    "radixrt.runtime.server_options",
    "radixrt.runtime.messages",
    "radixrt.runtime.lora_messages",
    "radixrt.runtime.image_messages",
    "radixrt.runtime.tree_messages",
    "radixrt.runtime.trace_messages",
    "radixrt.runtime.errors",
    "radixrt.runtime.sampling_params",
    "radixrt.runtime.pooling_params",
    "radixrt.runtime.outputs",
    "radixrt.runtime.ipc",
    "radixrt.runtime.helper_process",
    "radixrt.runtime.helper_main",
    "radixrt.runtime.distributed",
]
FRONTEND = "radixrt.frontend"
FRONTEND_LAYERS = [  # (layer name, module prefix), top to bottom
    ("frontend", FRONTEND),
    ("frontend.backends", "radixrt.frontend.backends"),
    ("frontend.lang", "radixrt.frontend.lang"),
]
FRONTEND_MAY_USE = [  # the torch-free part of the ground
    "radixrt.runtime.messages",
    "radixrt.runtime.config",
    "radixrt.runtime.sampling_params",
    "radixrt.runtime.pooling_params",
]
FRONTEND_NEVER = ["torch", "triton"]
CONFIG = "radixrt.runtime.config"
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")
CONSTANT_USERS = ["radixrt", "tests", "benchmarks", "examples"]  # folders whose modules count


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The layer a module belongs to: the longest matching prefix wins ("radixrt" alone is the
    package's public API, at the top)."""
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            exact_only = prefix == "radixrt"
            hit = module == prefix if exact_only else _within(module, prefix)
            if hit and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    if module == "radixrt.runtime" or any(_within(module, g) for g in GROUND):
        return "ground"
    if _within(module, FRONTEND):
        return max((p for p in FRONTEND_LAYERS if _within(module, p[1])),
                   key=lambda p: len(p[1]))[0]
    return best


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names (relative ones resolved from `package`)."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imports_of(path: Path, module: str, submodules: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, function-local and TYPE_CHECKING
    ones included; `from m import a, b` gives m, or with `submodules` m.a and m.b (each a module,
    or a name in m)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node, package)
            if submodules:
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return found


def frontend_violations(where: str, here: str, target: str) -> list[str]:
    """A frontend module's import: of the runtime only FRONTEND_MAY_USE, never torch, and
    down the frontend's own layers (lang never imports backends)."""
    allowed = [FRONTEND, *FRONTEND_MAY_USE]
    outside = _within(target, "radixrt") and not any(_within(target, m) for m in allowed)
    if outside or any(_within(target, t) for t in FRONTEND_NEVER):
        return [f"{where}: the frontend imports {target}"]
    order = [name for name, _ in FRONTEND_LAYERS]
    there = layer_of(target) if _within(target, FRONTEND) else None
    if there is not None and order.index(there) < order.index(here):
        return [f"{where}: {here} imports {target} ({there}) above it"]
    return []


def violations(root: Path) -> list[str]:
    """Every import under `root` (the radixrt package folder) that runs against the order."""
    order = [name for name, _ in LAYERS]
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        here = layer_of(module)
        where = f"{path.relative_to(root.parent)}"
        if here is None:
            bad.append(f"{where}: module {module} belongs to no layer (add it to LAYERS)")
            continue
        for line, target in imports_of(path, module):
            if _within(module, FRONTEND):
                bad += frontend_violations(f"{where}:{line}", here, target)
                continue
            if not _within(target, "radixrt"):
                continue
            there = layer_of(target)
            if there is None or there == here:
                continue
            if here == "ground":
                bad.append(f"{where}:{line}: the ground imports {target} ({there})")
            elif _within(target, FRONTEND):
                if here != "cli":
                    bad.append(f"{where}:{line}: {here} imports the frontend ({target})")
            elif there != "ground" and order.index(there) < order.index(here):
                bad.append(f"{where}:{line}: {here} imports {target} ({there}) above it")
    return bad


def modules_of(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (function-local and TYPE_CHECKING imports
    included, as the layer check counts them). `from pkg import name` points at pkg.name when
    that is a module, else at pkg (its __init__)."""
    modules = modules_of(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for _, target in imports_of(path, module, submodules=True):
            while target and target not in modules:  # `import a.b.C`-style tails
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def import_circles(root: Path) -> list[list[str]]:
    """Every set of modules that import each other in a circle (the strongly connected
    components of more than one module, Tarjan's algorithm), each sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def repeated_file_names(root: Path) -> list[str]:
    """File names (but __init__.py and __main__.py) that more than one module of the package
    has."""
    names = Counter(p.name for p in root.rglob("*.py") if p.name not in ("__init__.py",
                                                                          "__main__.py"))
    return sorted(name for name, count in names.items() if count > 1)


def config_constants() -> list[str]:
    tree = ast.parse((ROOT / "runtime" / "config.py").read_text())
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name) and CONSTANT.fullmatch(leaf.id):
                    names.append(leaf.id)
    return names


def config_names_used(path: Path, module: str) -> Iterator[str]:
    """The config.py names a file uses: imported from config, read as `config.NAME`, or (in
    config.py itself) read."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    aliases: set[str] = set()  # what the config module is called here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve(node, package)
            for alias in node.names:
                if base == CONFIG:
                    yield alias.name
                elif f"{base}.{alias.name}" == CONFIG:
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == CONFIG and a.asname)
        elif module == CONFIG and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            yield node.id
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            yield node.attr


def constant_users() -> dict[str, set[str]]:
    """config constant -> the modules (radixrt's, the tests', benchmarks', examples') using it."""
    constants = set(config_constants())
    users: dict[str, set[str]] = {name: set() for name in constants}
    for folder in CONSTANT_USERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(REPO).parts):
                continue  # a benchmark's own venv (benchmarks/.outlines-venv), caches
            module = module_name(path, ROOT if folder == "radixrt" else REPO / folder)
            for name in set(config_names_used(path, module)) & constants:
                users[name].add(module)
    return users


def single_use_constants() -> list[str]:
    """config constants that one module only uses (besides tests of it and scripts): they
    belong beside their use. A constant config.py itself uses, or two modules of the package
    share, stays; a test's or benchmark's use counts as its module's."""
    single: list[str] = []
    for name, users in sorted(constant_users().items()):
        package_users = {u for u in users if _within(u, "radixrt")}
        if len(package_users) == 1 and package_users != {CONFIG}:
            single.append(f"{name}: only {package_users.pop()} uses it")
        elif not package_users and len(users) <= 1:
            single.append(f"{name}: no module of radixrt uses it ({sorted(users)})")
    return single


def package_copy(tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "radixrt"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_every_import_points_down_the_layers() -> None:
    assert violations(ROOT) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Inside one layer too: who knows whom is decided, one way (function-local and
    TYPE_CHECKING imports count: hiding an import does not break a circle)."""
    assert import_circles(ROOT) == []


def test_module_file_names_are_unique() -> None:
    """A module's file name says what it is, wherever it is imported from or named in a
    traceback: no two modules share one (the packages' __init__.py and __main__.py aside)."""
    assert repeated_file_names(ROOT) == []


def test_config_holds_only_shared_constants() -> None:
    """A constant of config.py is there because two modules (or config.py's dataclasses and a
    module) share it; one that a single module uses lives in that module, beside its use."""
    assert single_use_constants() == []


@pytest.mark.parametrize(
    "file, source, fragment",
    [
        ("runtime/worker/bad.py", "from radixrt.runtime.engine import Engine\n", "worker imports"),
        ("runtime/models/bad.py", "def f():\n    import radixrt.runtime.worker.worker\n",
         "models imports"),
        ("runtime/forward/bad.py", "from ..scheduler import planner\n", "forward imports"),
        ("frontend/lang/bad.py", "import torch\n", "the frontend imports torch"),
        ("frontend/backends/bad.py", "from radixrt.runtime.engine import Engine\n",
         "frontend imports"),
        ("frontend/lang/bad.py", "from radixrt.frontend.backends import zmq_client\n",
         "frontend.lang imports radixrt.frontend.backends"),
        ("frontend/lang/bad.py", "def f():\n    from ..backends.zmq_client import DslClient\n",
         "frontend.lang imports radixrt.frontend.backends.zmq_client"),
        ("runtime/config_extra.py", "x = 1\n", "belongs to no layer"),
    ],
)
def test_an_import_against_the_order_is_caught(tmp_path: Path, file: str, source: str,
                                               fragment: str) -> None:
    """The checker on a copy of the package with one import added against the order."""
    root = package_copy(tmp_path)
    assert violations(root) == []
    (root / file).write_text(source)
    found = violations(root)
    assert len(found) == 1 and fragment in found[0], found


@pytest.mark.parametrize(
    "files, circle",
    [
        ({"runtime/scheduler/circle_a.py": "from radixrt.runtime.scheduler import circle_b\n",
          "runtime/scheduler/circle_b.py": "from .circle_a import X\n"},
         ["radixrt.runtime.scheduler.circle_a", "radixrt.runtime.scheduler.circle_b"]),
        ({"frontend/lang/circle_a.py": "def f():\n    from . import circle_b\n",
          "frontend/lang/circle_b.py": "import radixrt.frontend.lang.circle_c\n",
          "frontend/lang/circle_c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from radixrt.frontend.lang.circle_a import f\n"},
         ["radixrt.frontend.lang.circle_a", "radixrt.frontend.lang.circle_b",
          "radixrt.frontend.lang.circle_c"]),
        ({"runtime/worker/circle_a.py": "from radixrt.runtime.worker import circle_b\n",
          "runtime/worker/circle_b.py": "from radixrt.runtime import worker\n",
          "runtime/worker/__init__.py": "from radixrt.runtime.worker.circle_a import x\n"},
         ["radixrt.runtime.worker", "radixrt.runtime.worker.circle_a",
          "radixrt.runtime.worker.circle_b"]),
    ],
    ids=["module-level", "function-local-and-type-checking", "through-a-package"],
)
def test_a_planted_import_circle_is_caught(tmp_path: Path, files: dict[str, str],
                                           circle: list[str]) -> None:
    """The circle finder on a copy of the package with a circle planted: it reports that circle
    and only it."""
    root = package_copy(tmp_path)
    assert import_circles(root) == []
    for file, source in files.items():
        (root / file).write_text(source)
    assert import_circles(root) == [circle]


def test_a_repeated_file_name_is_caught(tmp_path: Path) -> None:
    root = package_copy(tmp_path)
    (root / "runtime" / "scheduler" / "sampler.py").write_text("x = 1\n")
    assert repeated_file_names(root) == ["sampler.py"]
