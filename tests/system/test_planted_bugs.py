"""The planted-bug harness (scripts/planted_bugs.py, scripts/plant_bugs.py) stays usable: every
bug still applies to the tree exactly once and leaves it compiling, every test it names exists,
and the runner catches one fast, model-free bug end to end."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
FAST_BUG = "pool-double-free-unchecked"  # caught by tests/runtime/scheduler/test_page_pool.py


def load_bugs() -> Any:
    if str(SCRIPTS) not in sys.path:  # planted_bugs.py imports its siblings by name
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("planted_bugs", SCRIPTS / "planted_bugs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("planted_bugs", module)
    spec.loader.exec_module(module)
    return module


PLANTED = load_bugs()
BUGS = PLANTED.BUGS


def test_there_are_enough_bugs_in_every_area_with_unique_names() -> None:
    assert len(BUGS) >= 45
    assert len(PLANTED.AREAS) == 10
    names = Counter(bug.name for bug in BUGS)
    assert not [name for name, n in names.items() if n > 1], names
    per_area = Counter(bug.area for bug in BUGS)
    assert set(per_area) <= set(PLANTED.AREAS), set(per_area) - set(PLANTED.AREAS)
    assert all(per_area[area] >= 3 for area in PLANTED.AREAS), per_area
    for bug in BUGS:
        assert bug.old != bug.new and bug.tests and bug.why, bug.name
        assert bug.path.startswith("radixrt/"), bug.name


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_a_bug_applies_once_and_still_compiles(bug: Any) -> None:
    path = ROOT / bug.path
    assert path.is_file(), f"{bug.name}: {bug.path} does not exist (stale)"
    text = path.read_text(encoding="utf-8")
    assert text.count(bug.old) == 1, f"{bug.name}: `old` occurs {text.count(bug.old)} times"
    compile(text.replace(bug.old, bug.new), str(path), "exec")


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_the_tests_a_bug_names_exist(bug: Any) -> None:
    for target in bug.tests:
        file, _, node = target.partition("::")
        path = ROOT / file
        assert path.is_file(), f"{bug.name}: no test file {file}"
        if node:
            function = re.sub(r"\[.*\]$", "", node.split("::")[-1])
            assert re.search(rf"^(async )?def {re.escape(function)}\(", path.read_text(
                encoding="utf-8"), re.M), f"{bug.name}: no test {function} in {file}"


def test_the_runner_catches_one_bug_end_to_end() -> None:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout: the runner copies the tree's git-listed files")
    run = subprocess.run([sys.executable, str(SCRIPTS / "plant_bugs.py"), "--only", FAST_BUG,
                          "--timeout", "300"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "caught 1 / planted 1" in run.stdout, run.stdout
    assert "test_page_pool.py::" in run.stdout, run.stdout  # the first failing test is named
