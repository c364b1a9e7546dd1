"""The thinking section of a reasoning model's output, split off as the text streams: each feed
returns the reasoning and the content it decides, holding back a partial tag until it is
decided, so the split does not depend on how the text is chunked.

Rules (formats in constrained/structural.py):
- starts_inside (DeepSeek-R1): the output begins inside the thinking. An opener at the very
  start (after optional whitespace, which is dropped with it) is skipped; everything up to the
  closer is reasoning; with no closer, everything is.
- otherwise (Qwen 3): an output that begins (after optional whitespace, dropped) with the
  opener thinks up to the closer; any other output is all content, leading whitespace included.
- The reasoning is kept raw (whitespace after the opener and before the closer included);
  whitespace after the closer, before the first other character, is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.constrained.structural import ReasoningFormat


@dataclass
class ReasoningDelta:
    """What one feed() or finish() releases."""

    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    """Feed the model's output as it comes; finish() releases a held partial tag."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self._state = "start"  # start, reasoning, after (the closer), content, done
        self._held = ""  # start: whitespace and a partial opener; reasoning: a partial closer
        self._seen = fmt.starts_inside
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @property
    def in_reasoning(self) -> bool:
        """Still inside the thinking."""
        return self._state == "reasoning" or (self._state == "start" and self.fmt.starts_inside)

    @property
    def reasoning_seen(self) -> bool:
        """The output has a thinking section."""
        return self._seen

    def feed(self, text: str) -> ReasoningDelta:
        if self._state == "done":
            return ReasoningDelta(content=text)
        self._run(text)
        return self._take()

    def finish(self) -> ReasoningDelta:
        """The output ended: a held partial tag is released as what it was inside."""
        if self._state == "start" and not self.fmt.starts_inside:
            self._content.append(self._held)
        elif self._state in ("start", "reasoning"):
            self._reasoning.append(self._held)
        self._held = ""
        self._state = "done"
        return self._take()

    def _take(self) -> ReasoningDelta:
        delta = ReasoningDelta("".join(self._reasoning), "".join(self._content))
        self._reasoning, self._content = [], []
        return delta

    def _run(self, text: str) -> None:
        i, n = 0, len(text)
        while i < n:
            if self._state == "start":
                i = self._step_start(text, i)
            elif self._state == "reasoning":
                i = self._step_reasoning(text, i)
            elif self._state == "after":
                while i < n and text[i].isspace():
                    i += 1
                if i < n:
                    self._state = "content"
            else:
                self._content.append(text[i:])
                i = n

    def _step_start(self, text: str, i: int) -> int:
        """Whitespace, then the opener or not."""
        c = text[i]
        opener = self.fmt.opener
        partial = self._held.lstrip()
        if not partial and c.isspace():
            self._held += c
            return i + 1
        if opener.startswith(partial + c):
            self._held += c
            if partial + c == opener:
                self._held, self._state, self._seen = "", "reasoning", True
            return i + 1
        held, self._held = self._held, ""
        if self.fmt.starts_inside:  # the held text is reasoning (it may begin the closer)
            self._state = "reasoning"
            self._run(held)
        else:
            self._content.append(held)
            self._state = "content"
        return i

    def _step_reasoning(self, text: str, i: int) -> int:
        """Reasoning up to the closer; a partial closer is held."""
        closer = self.fmt.closer
        if not self._held:
            j = text.find(closer[0], i)
            if j != i:
                end = len(text) if j < 0 else j
                self._reasoning.append(text[i:end])
                return end
        candidate = self._held + text[i]
        if closer.startswith(candidate):
            self._held = candidate
            if candidate == closer:
                self._held, self._state = "", "after"
            return i + 1
        self._reasoning.append(self._held)  # the closer's first character does not recur in it
        self._held = ""
        return i


def split_reasoning(fmt: ReasoningFormat, text: str) -> tuple[str | None, str]:
    """(reasoning, or None when the output had no thinking section; content)."""
    parser = ReasoningParser(fmt)
    first, last = parser.feed(text), parser.finish()
    reasoning = first.reasoning + last.reasoning
    return (reasoning if parser.reasoning_seen else None), first.content + last.content
