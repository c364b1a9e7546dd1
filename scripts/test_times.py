"""Where the test suite's time goes, by file: reads the report of `pytest --durations=0` and prints
a Markdown table (tests, set-up s, call s, teardown s, total, share), largest first.

    python -m pytest -q --durations=0 > durations.txt
    python scripts/test_times.py durations.txt [--top 40]

Set-up time is mostly fixtures: a model loaded, a server started (once per module or session, so
it lands on the first test that needs it); call time is the tests themselves.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# "12.34s call     tests/runtime/test_x.py::test_y[a-b]"
DURATION_LINE = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(\S+?)::(.+)$")
PHASES = ("setup", "call", "teardown")


@dataclass
class FileTimes:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    tests: set[str] = field(default_factory=set)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def parse(text: str) -> dict[str, FileTimes]:
    """File -> its times, from the lines of pytest's durations report."""
    files: dict[str, FileTimes] = defaultdict(FileTimes)
    for line in text.splitlines():
        match = DURATION_LINE.match(line)
        if match is None:
            continue
        seconds, phase, path, test = match.groups()
        files[path].seconds[phase] += float(seconds)
        files[path].tests.add(test)
    return dict(files)


def table(files: dict[str, FileTimes], top: int | None = None) -> str:
    total = sum(f.total for f in files.values()) or 1.0
    ranked = sorted(files.items(), key=lambda item: -item[1].total)
    rows = ["| file | tests | set-up s | call s | teardown s | total s | share |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    shown = ranked if top is None else ranked[:top]
    for path, times in shown:
        s = times.seconds
        rows.append(f"| `{path}` | {len(times.tests)} | {s['setup']:.0f} | {s['call']:.0f} | "
                    f"{s['teardown']:.0f} | {times.total:.0f} | {100 * times.total / total:.1f}% |")
    rest = ranked[len(shown):]
    if rest:
        seconds = sum(t.total for _, t in rest)
        count = sum(len(t.tests) for _, t in rest)
        rows.append(f"| {len(rest)} other files | {count} | | | | {seconds:.0f} | "
                    f"{100 * seconds / total:.1f}% |")
    count = sum(len(t.tests) for t in files.values())
    rows.append(f"| **all** | {count} | | | | {total:.0f} | 100% |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the output of pytest --durations=0")
    parser.add_argument("--top", type=int, default=None, help="the largest N files only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = parse(args.report.read_text(errors="replace"))
    if not files:
        print(f"{args.report}: no durations found (run pytest with --durations=0)",
              file=sys.stderr)
        return 1
    print(table(files, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
