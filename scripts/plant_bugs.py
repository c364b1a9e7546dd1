"""Plant each known-realistic bug (scripts/planted_bugs.py) in a scratch copy of the tree, one at
a time, run the tests meant to catch it, and report which bugs the test suite catches.

    python scripts/plant_bugs.py                      # every bug against this repository
    python scripts/plant_bugs.py --root /tmp/base     # against another checkout of it
    python scripts/plant_bugs.py --area scheduler --markdown
    python scripts/plant_bugs.py --only radix-lock-leaf-stays-evictable --keep

The tree's files (`git ls-files -co --exclude-standard`: tracked and untracked, not ignored) are
copied once into a scratch folder. For each bug its file is patched there (a bug whose `old`
snippet does not occur exactly once is refused as "stale"), `python -m pytest -x -q <tests>`
runs with that folder as its working directory and first on PYTHONPATH (so its `radixrt` shadows
the editable install, in every subprocess the tests start too), and the file is restored.

Outcomes: "caught" (pytest failed, or ran past --timeout: its whole process group is killed),
"ESCAPED" (pytest passed: the tests did not notice), "error" (pytest could not run the tests:
usage, collection, nothing collected; or the bug is stale). The exit status is 0 only when
every bug was caught.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planted_bugs import AREAS, BUGS, PlantedBug  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-rfE")
# pytest's short summary lines: "FAILED tests/x.py::test_y - message" / "ERROR tests/x.py ..."
SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")


@dataclass
class Outcome:
    bug: PlantedBug
    outcome: str  # "caught", "ESCAPED" or "error"
    detail: str  # how: "tests failed", "timeout after 600s", "exit 2", "stale: ..."
    seconds: float
    first_failure: str = ""  # the first failing test id, when pytest named one


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="the tree to test (default: this repository)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="plant only these bugs")
    parser.add_argument("--area", choices=AREAS, help="plant only this area's bugs")
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="per bug: past it the bug counts as caught (default 600)")
    parser.add_argument("--markdown", action="store_true",
                        help="print a Markdown table of the outcomes at the end")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    return parser.parse_args(argv)


def select(args: argparse.Namespace) -> list[PlantedBug]:
    bugs = list(BUGS)
    if args.only:
        known = {bug.name for bug in bugs}
        unknown = [name for name in args.only if name not in known]
        if unknown:
            raise SystemExit(f"plant_bugs: unknown bug name(s): {', '.join(unknown)} "
                             "(--list names them)")
        wanted = set(args.only)
        bugs = [bug for bug in bugs if bug.name in wanted]
    if args.area:
        bugs = [bug for bug in bugs if bug.area == args.area]
    return bugs


def copy_tree(root: Path, scratch: Path) -> int:
    """Copy the tree's tracked and untracked (not ignored) files; returns how many."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard",
                             "-z"], check=True, capture_output=True).stdout
    count = 0
    for name in sorted(set(listed.decode().split("\0"))):
        src = root / name
        if not name or not (src.is_file() or src.is_symlink()):
            continue  # deleted in the work tree (or a submodule's folder)
        dst = scratch / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
        count += 1
    return count


def drop_bytecode(path: Path) -> None:
    """Remove the module's cached bytecode, so that neither the patched nor the restored source
    is ever shadowed by the other's .pyc (same size, same second)."""
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def first_failure(output: str) -> str:
    for line in output.splitlines():
        match = SUMMARY_LINE.match(line.strip())
        if match:
            return match.group(2)
    return ""


def run_tests(scratch: Path, tests: tuple[str, ...], timeout: float,
              log: Path) -> tuple[int | None, str]:
    """pytest on `tests` in `scratch`: (exit code or None on timeout, its output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(scratch), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(proc.pid)  # what the tests left running (servers), or all on a timeout
            proc.wait()
    return code, log.read_text(encoding="utf-8", errors="replace")


def plant(bug: PlantedBug, scratch: Path, timeout: float, log: Path) -> Outcome:
    start = time.monotonic()
    path = scratch / bug.path
    if not path.is_file():
        return Outcome(bug, "error", f"stale: {bug.path} does not exist", 0.0)
    original = path.read_text(encoding="utf-8")
    count = original.count(bug.old)
    if count != 1:
        return Outcome(bug, "error", f"stale: `old` occurs {count} times in {bug.path}", 0.0)
    missing = [t for t in bug.tests if not (scratch / t.split("::")[0]).exists()]
    if missing:
        return Outcome(bug, "error", f"stale: no test file {missing[0]}", 0.0)
    try:
        path.write_text(original.replace(bug.old, bug.new), encoding="utf-8")
        drop_bytecode(path)
        code, output = run_tests(scratch, bug.tests, timeout, log)
    finally:
        path.write_text(original, encoding="utf-8")
        drop_bytecode(path)
    seconds = time.monotonic() - start
    failure = first_failure(output)
    if code is None:
        return Outcome(bug, "caught", f"timeout after {timeout:g}s", seconds, failure)
    if code == 1:
        return Outcome(bug, "caught", "tests failed", seconds, failure)
    if code == 0:
        return Outcome(bug, "ESCAPED", "tests passed", seconds)
    tail = " | ".join(line for line in output.strip().splitlines()[-3:])
    return Outcome(bug, "error", f"pytest exit {code}: {tail[-300:]}", seconds, failure)


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| bug | area | outcome | seconds | first failing test |",
             "| --- | --- | --- | ---: | --- |"]
    for o in outcomes:
        what = o.outcome if o.outcome != "caught" or o.detail == "tests failed" else (
            f"caught ({o.detail})")
        if o.outcome == "error":
            what = f"error ({o.detail})".replace("|", "\\|")
        test = f"`{o.first_failure}`" if o.first_failure else ""
        lines.append(f"| {o.bug.name} | {o.bug.area} | {what} | {o.seconds:.1f} | {test} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bugs = select(args)
    if args.list:
        for bug in bugs:
            print(f"{bug.name}  [{bug.area}]  {bug.path}\n    {bug.why}\n    tests: "
                  f"{' '.join(bug.tests)}")
        return 0
    if not bugs:
        print("plant_bugs: no bug selected", file=sys.stderr)
        return 2
    root = args.root.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="plant_bugs."))
    log = Path(tempfile.mkstemp(prefix="plant_bugs.", suffix=".log")[1])
    started = time.monotonic()
    outcomes: list[Outcome] = []
    try:
        files = copy_tree(root, scratch)
        print(f"planting {len(bugs)} bug(s) in a copy of {root} ({files} files) at {scratch}",
              flush=True)
        width = max(len(bug.name) for bug in bugs)
        for i, bug in enumerate(bugs, 1):
            o = plant(bug, scratch, args.timeout, log)
            outcomes.append(o)
            how = o.first_failure or o.detail
            print(f"[{i:>2}/{len(bugs)}] {o.outcome:<7} {bug.name:<{width}} {bug.area:<12} "
                  f"{o.seconds:6.1f}s  {how}", flush=True)
            if o.outcome == "caught" and o.detail != "tests failed":
                print(f"        ({o.detail})", flush=True)
            if o.outcome == "error" and o.first_failure:
                print(f"        ({o.detail})", flush=True)
    finally:
        log.unlink(missing_ok=True)
        if args.keep:
            print(f"scratch copy kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    caught = [o for o in outcomes if o.outcome == "caught"]
    escaped = [o.bug.name for o in outcomes if o.outcome == "ESCAPED"]
    errored = [o for o in outcomes if o.outcome == "error"]
    if args.markdown:
        print()
        print(markdown(outcomes))
        print()
    print(f"caught {len(caught)} / planted {len(outcomes)} "
          f"(in {time.monotonic() - started:.0f}s)")
    if escaped:
        print(f"ESCAPED ({len(escaped)}): {', '.join(escaped)}")
    if errored:
        print(f"error ({len(errored)}): " + "; ".join(f"{o.bug.name} ({o.detail})"
                                                      for o in errored))
    return 0 if not escaped and not errored else 1


if __name__ == "__main__":
    sys.exit(main())
