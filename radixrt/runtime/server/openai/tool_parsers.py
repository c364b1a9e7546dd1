"""Tool calls in model output, found as the text streams: a character-level state machine that
splits the output into content and call deltas (each call's name, then its arguments text in
fragments), for the formats of constrained/structural.py.

A call block is the format's opener (its tag; the newlines around the tags are whitespace), a
JSON object whose first key is "name" (a string) and whose second is the format's arguments key,
then the arguments value, then (Hermes) anything up to the closer. Text that may still turn out
to open a call (a partial tag, whitespace before a tag, a header not yet complete) is held back
until it is decided, so the content and the calls do not depend on how the text is chunked.

Rules:
- Hermes: content, call blocks anywhere. Whitespace right before a call's opener and right
  after a call's closer is dropped. A block whose header cannot be a call's (`<tool_call>hi`,
  a non-string name, "arguments" first) is content up to and including the first closer after
  its opener (whitespace before it stays content too). After a call's arguments value,
  everything up to and including the closer is skipped.
- Llama-3 JSON (no opener): the output is calls only if its first non-whitespace character is
  `{`; otherwise (or if the first block's header is not a call's) it is all content, as written.
  Calls are joined by whitespace and at most one `;` (the separator). After a call, the first
  other text (a malformed block, words, junk before the call's closing `}`) starts content
  that runs to the end; the separator and whitespace before it are dropped.
- The arguments value ends where its JSON ends: strings and escapes are tracked, `{}` and `[]`
  nest; a bare scalar ends before whitespace, `,`, `}`, `]` or `<`.
- A name's raw JSON text longer than MAX_NAME_CHARS makes the header not a call's.
- At the end of the output a held partial tag is content; a block cut short in its header
  (opened, its name not yet known) is dropped; a call whose arguments were cut short stands
  with what it had.
"""

from __future__ import annotations

import json
import re

from radixrt.runtime.config import MAX_NAME_CHARS
from radixrt.runtime.constrained.structural import ToolFormat
from radixrt.runtime.server.openai.tool_call_deltas import Parsed, Release, ToolCall

_WS = " \t\n\r"  # JSON's whitespace
_WS_RUN = re.compile(r"[ \t\n\r]+")
_STRING_RUN = re.compile(r'[^"\\]+')  # inside a JSON string: up to a quote or an escape
_STRUCTURE_RUN = re.compile(r'[^"{}\[\]]+')  # outside strings: up to a quote or a bracket
_SCALAR_END = _WS + ",}]<"
_SCALAR_RUN = re.compile(r"[^ \t\n\r,}\]<]+")
_HEX = set("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = set('"\\/bfnrt')
_NAME = None  # the header token that is the name's JSON string


def _end_of(run: re.Pattern[str], piece: str, i: int) -> int:
    """The end of `run` matched at i (at least one character)."""
    found = run.match(piece, i)
    return found.end() if found else i + 1


class ToolCallParser:
    """Feed the model's output as it comes; each feed returns the content and call deltas it
    decides. finish() releases what is held back at the end."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._opener = fmt.opener.strip()
        self._closer = fmt.closer.strip()
        self._separator = fmt.separator.strip()
        self._header_tokens: list[str | None] = [
            "{", '"name"', ":", _NAME, ",", json.dumps(fmt.arguments_key), ":"]
        if self._opener:
            self._content_run = re.compile(f"[^{re.escape(self._opener[0])} \\t\\n\\r]+")
        self._out = Release()
        self._refeed: str | None = None
        self._done = False
        self._names: list[str] = []
        self._arguments: list[list[str]] = []
        # content (Hermes) and the start (Llama-3): held whitespace and partial opener
        self._held_ws: list[str] = []
        self._partial = ""
        self._drop_ws = False  # right after a call's closer
        # the header
        self._pending = ""  # released as content if the header is not a call's
        self._header: list[str] = []
        self._token = 0
        self._matched = 0  # characters of the current literal token matched
        self._name_raw: list[str] = []
        self._name = ""
        self._escape = 0  # 0, 1 after a backslash, 2..5 within \\uXXXX
        # the arguments value
        self._depth = 0
        self._in_string = False
        self._value_escape = False
        # closer matching (Hermes), separator seen (Llama-3)
        self._closer_matched = 0
        self._separator_seen = False
        self._state = "content" if self._opener else "start"
        self._steps = {
            "content": self._step_content, "start": self._step_start,
            "header": self._step_header, "malformed": self._step_malformed,
            "value": self._step_value, "container": self._step_container,
            "string": self._step_string, "scalar": self._step_scalar,
            "skip": self._step_skip, "after": self._step_after,
            "between": self._step_between, "passthrough": self._step_passthrough,
        }

    # --- public ---------------------------------------------------------------------------

    def feed(self, text: str) -> Parsed:
        """The next piece of model output: what of it (and of held text) is now decided."""
        if self._done:
            return Parsed(content=text)
        self._run(text)
        return self._take()

    def finish(self) -> Parsed:
        """The output ended: release what is held back."""
        if self._done:
            return Parsed()
        self._done = True
        state = self._state
        if state == "content":
            self._release_held()
        elif state == "start":
            self._out.text("".join(self._held_ws))
        # state "header": a call cut short before its name was known (max_tokens ran out in
        # it) is dropped, as a call cut short in its arguments keeps what it had
        self._held_ws, self._partial, self._header, self._pending = [], "", [], ""
        return self._take()

    @property
    def calls(self) -> list[ToolCall]:
        """Every call seen so far, complete or cut short."""
        return [ToolCall(n, "".join(a)) for n, a in zip(self._names, self._arguments)]

    # --- the machine ----------------------------------------------------------------------

    def _take(self) -> Parsed:
        parsed = self._out.parsed()
        self._out = Release()
        return parsed

    def _run(self, text: str) -> None:
        stack = [text]
        while stack:
            piece = stack.pop()
            i, n = 0, len(piece)
            while i < n:
                i = self._steps[self._state](piece, i)
                if self._refeed is not None:
                    stack.append(piece[i:])
                    stack.append(self._refeed)
                    self._refeed = None
                    break

    def _emit_arguments(self, text: str) -> None:
        index = len(self._names) - 1
        self._arguments[index].append(text)
        self._out.arguments(index, text)

    def _release_held(self) -> None:
        self._out.text("".join(self._held_ws) + self._partial)
        self._held_ws, self._partial = [], ""

    # content (Hermes)

    def _step_content(self, piece: str, i: int) -> int:
        c = piece[i]
        if self._partial:
            candidate = self._partial + c
            if not self._opener.startswith(candidate):
                self._release_held()
                return i  # c may start an opener itself
            self._partial = candidate
            if candidate == self._opener:
                self._pending = "".join(self._held_ws) + candidate
                self._held_ws, self._partial = [], ""
                self._open_header()
            return i + 1
        if c in _WS:
            end = _end_of(_WS_RUN, piece, i)
            if not self._drop_ws:
                self._held_ws.append(piece[i:end])
            return end
        self._drop_ws = False
        if c == self._opener[0]:
            self._partial = c
            return i + 1
        end = _end_of(self._content_run, piece, i)
        self._release_held()
        self._out.text(piece[i:end])
        return end

    # the start (Llama-3): calls only if the first non-whitespace character is "{"

    def _step_start(self, piece: str, i: int) -> int:
        c = piece[i]
        if c in _WS:
            end = _end_of(_WS_RUN, piece, i)
            self._held_ws.append(piece[i:end])
            return end
        held = "".join(self._held_ws)
        self._held_ws = []
        if c == "{":
            self._pending = held
            self._open_header()
        else:
            self._out.text(held)
            self._state = "passthrough"
        return i

    def _step_passthrough(self, piece: str, i: int) -> int:
        self._out.text(piece[i:])
        return len(piece)

    # the header: {"name": "<name>", "<arguments key>":

    def _open_header(self) -> None:
        self._state = "header"
        self._header, self._token, self._matched = [], 0, 0
        self._name_raw, self._escape = [], 0

    def _step_header(self, piece: str, i: int) -> int:
        c = piece[i]
        token = self._header_tokens[self._token]
        if token is _NAME and self._matched:
            return self._step_name(c, i)
        if self._matched == 0 and c in _WS:
            self._header.append(c)
            return i + 1
        literal = token if token is not None else '"'  # the name: its opening quote
        if c != literal[self._matched]:
            self._fail_header()
            return i
        self._header.append(c)
        self._matched += 1
        if token is not _NAME and self._matched == len(literal):
            self._next_token()
        return i + 1

    def _step_name(self, c: str, i: int) -> int:
        """Within the name's string (its opening quote seen)."""
        if self._escape == 1:
            ok = c in _SIMPLE_ESCAPES or c == "u"
            self._escape = 2 if c == "u" else 0
        elif self._escape:
            ok = c in _HEX
            self._escape = 0 if self._escape == 5 else self._escape + 1
        elif c == '"':
            name = self._decode_name()
            if name is None:
                self._fail_header()
                return i
            self._header.append(c)
            self._name = name
            self._next_token()
            return i + 1
        else:
            ok = True
            self._escape = 1 if c == "\\" else 0
        if not ok or len(self._name_raw) >= MAX_NAME_CHARS:
            self._fail_header()
            return i
        self._name_raw.append(c)
        self._header.append(c)
        return i + 1

    def _decode_name(self) -> str | None:
        try:
            name = json.loads('"' + "".join(self._name_raw) + '"', strict=False)
        except ValueError:
            return None
        return name if isinstance(name, str) else None

    def _next_token(self) -> None:
        self._token += 1
        self._matched = 0
        if self._token < len(self._header_tokens):
            return
        index = len(self._names)
        self._names.append(self._name)
        self._arguments.append([])
        self._out.start(index, self._name)
        self._header, self._pending = [], ""
        self._state = "value"

    def _fail_header(self) -> None:
        """The buffered text cannot begin a call's header: it is content."""
        header = "".join(self._header)
        self._header = []
        if self._opener:  # a malformed block: content through its closer
            self._out.text(self._pending)
            self._state = "malformed"
            self._closer_matched = 0
            self._refeed = header
        else:  # the rest of the output is content
            self._out.text(self._pending + header)
            self._state = "passthrough"
        self._pending = ""

    # the arguments value

    def _step_value(self, piece: str, i: int) -> int:
        c = piece[i]
        if c in _WS:
            return _end_of(_WS_RUN, piece, i)
        if c in "{[":
            self._state, self._depth, self._in_string = "container", 1, False
        elif c == '"':
            self._state, self._value_escape = "string", False
        elif c in _SCALAR_END:
            self._end_value()
            return i
        else:
            self._state = "scalar"
            return i
        self._emit_arguments(c)
        return i + 1

    def _step_container(self, piece: str, i: int) -> int:
        if self._in_string:
            end = self._string_step(piece, i)
            self._emit_arguments(piece[i:end])
            return end
        c = piece[i]
        if c == '"':
            self._in_string, self._value_escape = True, False
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._emit_arguments(c)
                self._end_value()
                return i + 1
        else:
            end = _end_of(_STRUCTURE_RUN, piece, i)
            self._emit_arguments(piece[i:end])
            return end
        self._emit_arguments(c)
        return i + 1

    def _step_string(self, piece: str, i: int) -> int:
        end = self._string_step(piece, i)
        self._emit_arguments(piece[i:end])
        if not self._in_string:
            self._end_value()
        return end

    def _string_step(self, piece: str, i: int) -> int:
        """Within a string of the value: the end of the next run; the closing quote clears
        _in_string."""
        self._in_string = True
        c = piece[i]
        if self._value_escape:
            self._value_escape = False
        elif c == "\\":
            self._value_escape = True
        elif c == '"':
            self._in_string = False
        else:
            return _end_of(_STRING_RUN, piece, i)
        return i + 1

    def _step_scalar(self, piece: str, i: int) -> int:
        if piece[i] in _SCALAR_END:
            self._end_value()
            return i
        end = _end_of(_SCALAR_RUN, piece, i)
        self._emit_arguments(piece[i:end])
        return end

    def _end_value(self) -> None:
        self._in_string = False
        if self._opener:
            self._state, self._closer_matched = "skip", 0
        else:
            self._state = "after"

    # after the value: Hermes skips to the closer; Llama-3 expects "}", then the next call

    def _match_closer(self, piece: str, i: int) -> tuple[int, bool]:
        """(the end of what this step consumed, whether it completed the closer)."""
        if self._closer_matched == 0:
            j = piece.find(self._closer[0], i)
            if j != i:
                return (len(piece) if j < 0 else j), False
        c = piece[i]
        if c == self._closer[self._closer_matched]:
            self._closer_matched += 1
            if self._closer_matched == len(self._closer):
                self._closer_matched = 0
                return i + 1, True
        else:  # the closer's first character does not recur in it
            self._closer_matched = 1 if c == self._closer[0] else 0
        return i + 1, False

    def _step_skip(self, piece: str, i: int) -> int:
        end, closed = self._match_closer(piece, i)
        if closed:
            self._state, self._drop_ws = "content", True
        return end

    def _step_malformed(self, piece: str, i: int) -> int:
        end, closed = self._match_closer(piece, i)
        self._out.text(piece[i:end])
        if closed:
            self._state = "content"
        return end

    def _step_after(self, piece: str, i: int) -> int:
        c = piece[i]
        if c in _WS:
            return _end_of(_WS_RUN, piece, i)
        if c == "}":
            self._state, self._separator_seen = "between", False
            return i + 1
        self._state = "passthrough"
        return i

    def _step_between(self, piece: str, i: int) -> int:
        c = piece[i]
        if c in _WS:
            return _end_of(_WS_RUN, piece, i)
        if c == self._separator and not self._separator_seen:
            self._separator_seen = True
            return i + 1
        if c == "{":
            self._pending = ""
            self._open_header()
        else:
            self._state = "passthrough"
        return i


def parse_tool_calls(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """Non-streaming: (content, calls) of a whole output."""
    parser = ToolCallParser(fmt)
    content = parser.feed(text).content + parser.finish().content
    return content, parser.calls
