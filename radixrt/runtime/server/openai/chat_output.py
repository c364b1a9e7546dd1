"""One chat choice's output, taken apart: the thinking (--reasoning-parser), then the tool calls
in the rest (the server's tool-call format), then the content that remains. The same parsers
run on a whole output and on a stream, so a streamed choice adds up to the non-streamed one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from radixrt.runtime.constrained.structural import ReasoningFormat, ToolFormat
from radixrt.runtime.server.openai.openai_protocol import ChatDelta, ChatMessageOut
from radixrt.runtime.server.openai.reasoning_parsers import ReasoningParser
from radixrt.runtime.server.openai.tool_parsers import ToolCallParser
from radixrt.runtime.server.openai.tool_protocol import (
    FunctionCallOut,
    FunctionDeltaOut,
    ToolCallDeltaOut,
    ToolCallOut,
)

ID_HEX = 24  # ids the server makes ("call_", "msg_", "resp_", ...): a prefix + this many hex digits


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:ID_HEX]}"


def new_call_id() -> str:
    return new_id("call")


@dataclass
class ChoicePiece:
    """What one piece of output releases, after holding back undecided text."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDeltaOut] = field(default_factory=list)

    def delta(self) -> ChatDelta:
        return ChatDelta(content=self.content or None, reasoning_content=self.reasoning or None,
                         tool_calls=self.calls or None)

    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.calls)


class ChoiceParser:
    """Feed a choice's text as it comes (feed), then end it (finish)."""

    def __init__(self, tool_format: ToolFormat | None, reasoning: ReasoningFormat | None) -> None:
        self._reasoning = ReasoningParser(reasoning) if reasoning is not None else None
        self._tools = ToolCallParser(tool_format) if tool_format is not None else None
        self._ids: list[str] = []
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str) -> ChoicePiece:
        return self._take(text, final=False)

    def finish(self) -> ChoicePiece:
        return self._take("", final=True)

    def _take(self, text: str, final: bool) -> ChoicePiece:
        piece = ChoicePiece()
        if self._reasoning is not None:
            split = self._reasoning.finish() if final else self._reasoning.feed(text)
            piece.reasoning, text = split.reasoning, split.content
        if self._tools is None:
            piece.content = text
        else:
            parsed = self._tools.feed(text)
            content, deltas = parsed.content, list(parsed.calls)
            if final:
                rest = self._tools.finish()
                content += rest.content
                deltas += rest.calls
            piece.content = content
            for call in deltas:
                first = call.name is not None
                if first:
                    self._ids.append(new_call_id())
                piece.calls.append(ToolCallDeltaOut(
                    index=call.index, id=self._ids[call.index] if first else None,
                    type="function" if first else None,
                    function=FunctionDeltaOut(name=call.name, arguments=call.arguments)))
        self.reasoning.append(piece.reasoning)
        self.content.append(piece.content)
        return piece

    @property
    def has_calls(self) -> bool:
        return bool(self._tools is not None and self._tools.calls)

    def message(self) -> ChatMessageOut:
        """The whole choice, after finish()."""
        calls = None
        if self._tools is not None and self._tools.calls:
            calls = [ToolCallOut(id=self._ids[i], function=FunctionCallOut(
                name=c.name, arguments=c.arguments)) for i, c in enumerate(self._tools.calls)]
        content = "".join(self.content)
        reasoning = "".join(self.reasoning)
        seen = self._reasoning is not None and self._reasoning.reasoning_seen
        return ChatMessageOut(content=content if content or calls is None else None,
                              tool_calls=calls, reasoning_content=reasoning if seen else None)


def finish_reason_with_calls(reason: str | None, has_calls: bool) -> str | None:
    """OpenAI's "tool_calls" where an output that made calls ended by itself."""
    return "tool_calls" if has_calls and reason == "stop" else reason


@dataclass(frozen=True)
class Segment:
    """One step of a choice's output as a sequence of parts (Anthropic's blocks, the Responses
    API's output items): a part opens, text is appended to it, it closes. kind: "reasoning",
    "text" or "call"; an opening call carries its id and name, its appends the arguments."""

    op: str  # "open" | "append" | "close"
    kind: str
    text: str = ""
    call_id: str | None = None
    name: str | None = None


class SegmentTracker:
    """Pieces (ChoiceParser's) -> Segments: a part opens when output of another kind, or
    another call, begins; the open part closes first. Only one part is open at a time."""

    def __init__(self) -> None:
        self.open_kind: str | None = None

    def feed(self, piece: ChoicePiece) -> list[Segment]:
        out: list[Segment] = []
        if piece.reasoning:
            out += self._ensure("reasoning")
            out.append(Segment("append", "reasoning", piece.reasoning))
        if piece.content:
            out += self._ensure("text")
            out.append(Segment("append", "text", piece.content))
        for call in piece.calls:
            if call.function.name is not None:  # a call's first delta
                out += self.close()
                self.open_kind = "call"
                out.append(Segment("open", "call", call_id=call.id, name=call.function.name))
            if call.function.arguments:
                out.append(Segment("append", "call", call.function.arguments))
        return out

    def _ensure(self, kind: str) -> list[Segment]:
        if self.open_kind == kind:
            return []
        out = self.close()
        self.open_kind = kind
        return [*out, Segment("open", kind)]

    def close(self) -> list[Segment]:
        if self.open_kind is None:
            return []
        kind, self.open_kind = self.open_kind, None
        return [Segment("close", kind)]
