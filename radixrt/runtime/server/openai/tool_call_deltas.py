"""What the tool-call detector (tool_parsers.py) releases as an output streams: content and
call deltas (a call's name, then fragments of its arguments), and the calls of a whole output."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CallDelta:
    """The next piece of call `index`: its name (first delta only), then arguments text."""

    index: int
    name: str | None
    arguments: str


@dataclass
class Parsed:
    """What one feed() or finish() releases."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCall:
    """A call of an output, complete or cut short."""

    name: str
    arguments: str  # the raw JSON text of the arguments value, exactly as written


class Release:
    """Collects one feed's output, merging consecutive argument fragments of one call."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: list[tuple[int, str | None, list[str]]] = []

    def text(self, text: str) -> None:
        if text:
            self.content.append(text)

    def start(self, index: int, name: str) -> None:
        self.calls.append((index, name, []))

    def arguments(self, index: int, fragment: str) -> None:
        if not self.calls or self.calls[-1][0] != index:
            self.calls.append((index, None, []))
        self.calls[-1][2].append(fragment)

    def parsed(self) -> Parsed:
        return Parsed("".join(self.content),
                      [CallDelta(i, name, "".join(parts)) for i, name, parts in self.calls])
