"""Where tests live, as rules a test (tests/system/test_layout.py) and a script can both use.

tests/ mirrors radixrt/ without its leading `radixrt/`: the tests of
radixrt/runtime/scheduler/planner.py are tests/runtime/scheduler/test_planner.py, those of
radixrt/cli.py are tests/test_cli.py. A file named test_<module>.py or test_<module>_<aspect>.py
tests that module (module file names are unique across the package, tests/system/test_layering.py
checks it); where two module names both fit (reference and reference_lse), the longer one is the
module. Whole-system tests (the docs, the examples, the benchmark scripts, soak, end-to-end servers,
the package's shape, this layout) are in tests/system/, under names that claim no module. Helpers
(conftest.py, tiny_models.py, this file, ...) are in tests/ itself, which pytest puts on sys.path,
and there is no __init__.py: every test file's name is unique.

    python tests/layout.py      # the modules no test file is named after, one per line
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "radixrt"
TESTS = REPO / "tests"
SYSTEM = "system"  # the folder of tests/ that holds the whole-system tests
NOT_MODULES = {"__init__.py", "__main__.py"}


def source_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Each module's file name (no .py) -> its path under the package: every **/*.py but
    __init__.py and __main__.py."""
    modules: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name in NOT_MODULES or "__pycache__" in path.parts:
            continue
        if path.stem in modules:
            raise ValueError(f"two modules named {path.stem}: {modules[path.stem]}, {path}")
        modules[path.stem] = path.relative_to(package)
    return modules


def module_of(stem: str, modules: dict[str, Path]) -> str | None:
    """The module a test file's name (stem) claims: test_<module> or test_<module>_<aspect>, the
    longest module name that fits; None if none does."""
    fits = [name for name in modules if stem == f"test_{name}" or stem.startswith(f"test_{name}_")]
    return max(fits, key=len, default=None)


def files_of_tests(tests: Path = TESTS) -> list[Path]:
    """Every test file under tests/, whole-system ones included."""
    return sorted(p for p in tests.rglob("test_*.py") if "__pycache__" not in p.parts)


def untested_modules(package: Path = PACKAGE, tests: Path = TESTS) -> list[str]:
    """The modules no test file outside tests/system/ is named after, as sorted paths from the
    repository root ("radixrt/runtime/scheduler/folding.py")."""
    modules = source_modules(package)
    tested = {module_of(p.stem, modules) for p in files_of_tests(tests)
              if p.relative_to(tests).parts[0] != SYSTEM}
    return sorted(f"{package.name}/{path.as_posix()}" for name, path in modules.items()
                  if name not in tested)


def layout_problems(package: Path = PACKAGE, tests: Path = TESTS) -> list[str]:
    """What breaks the layout, one line each, saying what to do: a test file whose name claims no
    module or that sits outside the folder mirroring its module's package, a whole-system test
    whose name claims a module, a helper below tests/, an __init__.py, two test files of one
    name."""
    modules = source_modules(package)
    problems: list[str] = []
    seen: dict[str, Path] = {}
    for path in files_of_tests(tests):
        rel = path.relative_to(tests)
        shown = f"{tests.name}/{rel.as_posix()}"
        if path.name in seen:
            problems.append(f"{shown}: {tests.name}/{seen[path.name].as_posix()} has its name "
                            "(test files' names must be unique: there is no __init__.py)")
        seen.setdefault(path.name, rel)
        module = module_of(path.stem, modules)
        if rel.parts[0] == SYSTEM:
            if module is not None:
                problems.append(f"{shown}: a whole-system test named after "
                                f"{package.name}/{modules[module].as_posix()}; rename it, or "
                                "move it beside that module's tests")
            continue
        if module is None:
            problems.append(f"{shown}: names no module of {package.name}/ (test_<module>.py or "
                            f"test_<module>_<aspect>.py; whole-system tests go in "
                            f"{tests.name}/{SYSTEM}/)")
            continue
        want = modules[module].parent
        if rel.parent != want:
            where = f"{tests.name}/{want.as_posix()}/".replace("/./", "/")
            problems.append(f"{shown}: tests {package.name}/{modules[module].as_posix()}, so it "
                            f"belongs in {where}")
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if "__pycache__" in rel.parts:
            continue
        if path.name == "__init__.py":
            problems.append(f"{tests.name}/{rel.as_posix()}: no __init__.py under tests/ "
                            "(helpers are imported from tests/ by name)")
        elif not path.name.startswith("test_") and len(rel.parts) > 1:
            problems.append(f"{tests.name}/{rel.as_posix()}: a helper belongs in {tests.name}/ "
                            "itself (only it is on sys.path for every test)")
    return problems


if __name__ == "__main__":
    print("\n".join(untested_modules()))
