"""The package layering: every import inside radixrt/ points down the layer order, and the DSL
frontend stands on nothing of the runtime but its wire messages and constants (and never torch).

Layer order, top to bottom (README and docs/architecture.md): cli -> launcher -> server ->
engine -> tokenizer -> scheduler -> worker -> constrained -> models -> forward -> kernels. The
ground (config, messages, errors, sampling_params, outputs, ipc, distributed) stands beneath every
layer and imports only itself. An import within one layer is always allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "radixrt"

LAYERS = [  # (layer name, module prefixes), top to bottom
    ("cli", ["radixrt", "radixrt.__main__", "radixrt.cli", "radixrt.plan_cli"]),
    ("launcher", ["radixrt.runtime.launcher", "radixrt.runtime.replicas"]),
    ("server", ["radixrt.runtime.server"]),
    ("engine", ["radixrt.runtime.engine", "radixrt.runtime.engine_manager"]),
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
    "radixrt.runtime.messages",
    "radixrt.runtime.errors",
    "radixrt.runtime.sampling_params",
    "radixrt.runtime.outputs",
    "radixrt.runtime.ipc",
    "radixrt.runtime.distributed",
]
FRONTEND = "radixrt.frontend"
FRONTEND_MAY_USE = [  # the torch-free part of the ground
    "radixrt.runtime.messages",
    "radixrt.runtime.config",
    "radixrt.runtime.sampling_params",
]
FRONTEND_NEVER = ["torch", "triton"]


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
        return "frontend"
    return best


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, function-local and TYPE_CHECKING
    ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
    return found


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
            if here == "frontend":
                allowed = [FRONTEND, *FRONTEND_MAY_USE]
                outside = _within(target, "radixrt") and not any(
                    _within(target, m) for m in allowed
                )
                if outside or any(_within(target, t) for t in FRONTEND_NEVER):
                    bad.append(f"{where}:{line}: the frontend imports {target}")
                continue
            if not _within(target, "radixrt"):
                continue
            there = layer_of(target)
            if there is None or there == here:
                continue
            if here == "ground":
                bad.append(f"{where}:{line}: the ground imports {target} ({there})")
            elif there == "frontend":
                if here != "cli":
                    bad.append(f"{where}:{line}: {here} imports the frontend ({target})")
            elif there != "ground" and order.index(there) < order.index(here):
                bad.append(f"{where}:{line}: {here} imports {target} ({there}) above it")
    return bad


def test_every_import_points_down_the_layers() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    "file, source, fragment",
    [
        ("runtime/worker/bad.py", "from radixrt.runtime.engine import Engine\n", "worker imports"),
        ("runtime/models/bad.py", "def f():\n    import radixrt.runtime.worker.worker\n",
         "models imports"),
        ("runtime/forward/bad.py", "from ..scheduler import planner\n", "forward imports"),
        ("frontend/bad.py", "import torch\n", "the frontend imports torch"),
        ("frontend/bad2.py", "from radixrt.runtime.engine import Engine\n", "frontend imports"),
        ("runtime/config_extra.py", "x = 1\n", "belongs to no layer"),
    ],
)
def test_an_import_against_the_order_is_caught(tmp_path: Path, file: str, source: str,
                                               fragment: str) -> None:
    """The checker on a copy of the package with one import added against the order."""
    import shutil

    root = tmp_path / "radixrt"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(root) == []
    (root / file).write_text(source)
    found = violations(root)
    assert len(found) == 1 and fragment in found[0], found
