"""The structure around generated text, as data and as regexes: tool-call formats (how a call
block opens, what its JSON looks like, how it closes), reasoning formats (the thinking section
before the answer), and the regexes that make the grammar engine enforce them.

A tool-call grammar comes in three modes:
- "required": the output is one or more call blocks (one with parallel=False), nothing else;
- "auto": free text that never contains the format's opener, optionally followed by call
  blocks. The model writes freely until it writes the opener; from there the call's grammar
  holds until the block closes (a trigger, in one automaton);
- "none": free text that never contains the opener (no call can start).

Each call's arguments are JSON valid under the tool's `parameters` schema; the name is one of
the tools'. Within a block the fixed text (keys, quotes, braces) is the same for every call, so
jump-forward appends it without sampling.

A reasoning grammar puts a free thinking section (which never contains the closing tag) before
the constraint it wraps: constraints apply to the answer, not to the thinking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.config import JSON_WHITESPACE_PATTERN, MAX_TOOLS
from radixrt.runtime.constrained.json_bounds import schema_to_regex

HERMES_TOOL_OPENER = "<tool_call>"  # Hermes / Qwen tool-call blocks
HERMES_TOOL_CLOSER = "</tool_call>"
THINK_OPENER = "<think>"  # reasoning models' thinking section (Qwen 3, DeepSeek-R1)
THINK_CLOSER = "</think>"

_REGEX_META = set("\\.^$|?*+()[]{}-&~#")
TOOL_CALL_MODES = ("required", "auto", "none")


def escape_literal(text: str) -> str:
    """Escape a literal for outlines-core's (Rust) regex syntax."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def _class_escape(char: str) -> str:
    return "\\" + char if char in "\\]^-[&~" else char


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call.

    A block is `opener` + `{"name": "<tool>", "<arguments_key>": <arguments JSON>}` + `closer`;
    several blocks are joined by `separator`. An empty opener means the calls are the whole
    output (Llama-3's JSON calls), so a call can only start at the beginning."""

    name: str
    opener: str
    closer: str
    separator: str
    arguments_key: str

    @property
    def trigger(self) -> str:
        """The opener's tag: free text may not contain it (a call starts there)."""
        return self.opener.strip()

    def call_prefix(self, tool: str) -> str:
        """The fixed text of a call up to its arguments."""
        return f'{{"name": {json.dumps(tool)}, "{self.arguments_key}": '

    def block(self, tool: str, arguments: str) -> str:
        """One whole call block, as the grammar (call_regex) makes the model write it."""
        return self.opener + self.call_prefix(tool) + arguments + "}" + self.closer


TOOL_FORMATS = {
    # Hermes / Qwen 2.5 / Qwen 3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    "hermes": ToolFormat("hermes", HERMES_TOOL_OPENER + "\n", "\n" + HERMES_TOOL_CLOSER, "\n",
                         "arguments"),
    # Llama 3.1 / 3.2 JSON tool calls: {"name": ..., "parameters": {...}}, several joined by "; "
    "llama3_json": ToolFormat("llama3_json", "", "", "; ", "parameters"),
}
TOOL_FORMAT_ALIASES = {"qwen": "hermes", "qwen25": "hermes", "qwen3": "hermes",
                       "llama3": "llama3_json"}


def tool_format(name: str) -> ToolFormat:
    """The format called `name` (or one of its aliases); ValueError listing the known ones."""
    found = TOOL_FORMATS.get(TOOL_FORMAT_ALIASES.get(name, name))
    if found is None:
        known = sorted([*TOOL_FORMATS, *TOOL_FORMAT_ALIASES])
        raise ValueError(f"tool-call format {name!r} is unknown: use one of {known}")
    return found


@dataclass(frozen=True)
class ReasoningFormat:
    """A thinking section: `opener` ... `closer` before the answer. With `starts_inside` the
    chat template has already written the opener, so the output begins inside the thinking
    (DeepSeek-R1); otherwise it begins with the opener or has no thinking at all (Qwen 3)."""

    name: str
    opener: str
    closer: str
    starts_inside: bool


REASONING_FORMATS = {  # keys: config.REASONING_FORMAT_NAMES
    "qwen3": ReasoningFormat("qwen3", THINK_OPENER, THINK_CLOSER, starts_inside=False),
    "deepseek-r1": ReasoningFormat("deepseek-r1", THINK_OPENER, THINK_CLOSER, starts_inside=True),
}


def reasoning_format(name: str) -> ReasoningFormat:
    found = REASONING_FORMATS.get(name)
    if found is None:
        raise ValueError(f"reasoning format {name!r} is unknown: use one of "
                         f"{sorted(REASONING_FORMATS)}")
    return found


# --- the tool-call spec a request carries (SamplingParams.tool_calls, JSON text) ---------------


@dataclass(frozen=True)
class ToolCallSpec:
    format: ToolFormat
    tools: tuple[tuple[str, str], ...]  # (name, parameters schema as JSON text)
    mode: str
    parallel: bool

    def to_json(self) -> str:
        return json.dumps({"format": self.format.name, "mode": self.mode,
                           "parallel": self.parallel,
                           "tools": [{"name": n, "parameters": json.loads(p)}
                                     for n, p in self.tools]}, sort_keys=True)


def fill_format(text: str, default: str) -> str:
    """A spec without a format (a DSL gen(tools=...)) takes the server's."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        return text  # parse_tool_call_spec names the problem
    if isinstance(spec, dict) and "format" not in spec:
        spec["format"] = default
        return json.dumps(spec)
    return text


def parse_tool_call_spec(text: str) -> ToolCallSpec:
    """The spec in SamplingParams.tool_calls; ValueError naming what is wrong."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool_calls is not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise ValueError("tool_calls must be a JSON object with format, mode, parallel, tools")
    unknown = sorted(set(spec) - {"format", "mode", "parallel", "tools"})
    if unknown:
        raise ValueError(f"tool_calls has unknown keys {unknown}: use format, mode, parallel, "
                         "tools")
    fmt = tool_format(str(spec.get("format", "")))
    mode = spec.get("mode", "required")
    if mode not in TOOL_CALL_MODES:
        raise ValueError(f"tool_calls mode {mode!r} is unknown: use one of {TOOL_CALL_MODES}")
    parallel = spec.get("parallel", True)
    if not isinstance(parallel, bool):
        raise ValueError(f"tool_calls parallel must be true or false, got {parallel!r}")
    tools = spec.get("tools")
    if not isinstance(tools, list) or (not tools and mode != "none"):
        raise ValueError("tool_calls needs tools: a non-empty list of {name, parameters}")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"tool_calls has {len(tools)} tools: at most {MAX_TOOLS} are allowed")
    out: list[tuple[str, str]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ValueError(f"tool_calls tool {i} needs a non-empty str name")
        params = tool.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ValueError(f"tool {tool['name']!r}: parameters must be a JSON schema object")
        out.append((tool["name"], json.dumps(params, sort_keys=True)))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"tool_calls has duplicate tool names: {sorted(names)}")
    return ToolCallSpec(fmt, tuple(out), mode, parallel)


# --- regexes -----------------------------------------------------------------------------------


def avoid_regex(word: str) -> str:
    """Any text (newlines included) that never contains `word`, for a word whose first
    character does not recur in it (every opener and closer here: "<tool_call>", "</think>").

    The automaton is the word's matcher: after a partial match, a character that continues it
    advances, the first character restarts it, anything else resets it. In regex form: blocks
    that return to the start (`[^c]`, or a partial match broken by another character), and at
    the end, any run of partial matches."""
    if not word:
        raise ValueError("avoid_regex needs a non-empty word")
    first = word[0]
    if first in word[1:]:
        raise ValueError(f"avoid_regex: {word!r} repeats its first character")
    not_first = f"[^{_class_escape(first)}]"
    # partial = first(w2(w3(...)?)?)? : a proper prefix of the word
    partial = ""
    for char in reversed(word[1:-1]):
        partial = f"(?:{escape_literal(char)}{partial})?"
    partial = escape_literal(first) + partial
    # broken = first(x2|w2(x3|w3(...))) : a proper prefix, then a character that neither
    # continues it nor restarts
    broken = ""
    for i in range(len(word) - 1, 0, -1):
        miss = f"[^{_class_escape(word[i])}{_class_escape(first)}]"
        broken = miss if not broken else f"(?:{miss}|{escape_literal(word[i])}{broken})"
    broken = escape_literal(first) + broken
    return f"(?:{not_first}|(?:{partial})*{broken})*(?:{partial})*"


def call_regex(fmt: ToolFormat, tools: tuple[tuple[str, str], ...]) -> str:
    """One call of any of the tools, without the block's opener and closer."""
    alternatives = []
    for name, schema in tools:
        try:
            args = schema_to_regex(schema, JSON_WHITESPACE_PATTERN)
        except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as exc:
            raise ValueError(f"tool {name!r}: its parameters schema cannot be used: {exc}") \
                from None
        alternatives.append(escape_literal(fmt.call_prefix(name)) + f"(?:{args})" + r"\}")
    return "(?:" + "|".join(alternatives) + ")"


def tool_calls_regex(spec: ToolCallSpec) -> str:
    fmt = spec.format
    # without an opener (Llama-3 JSON) text is an output whose first non-space character is not
    # "{": the parser takes one that is for calls, after any whitespace
    text = avoid_regex(fmt.trigger) if fmt.trigger else r"[ \t\n\r]*(?:[^{ \t\n\r][\s\S]*)?"
    if spec.mode == "none" or not spec.tools:
        return text
    block = escape_literal(fmt.opener) + call_regex(fmt, spec.tools) + escape_literal(fmt.closer)
    blocks = block + (f"(?:{escape_literal(fmt.separator)}{block})*" if spec.parallel else "")
    if spec.mode == "required":
        return blocks
    if fmt.trigger:  # auto: free text, then (at the opener's tag) calls
        return f"{text}(?:{blocks})?"
    return f"(?:{blocks}|{text})"  # auto without an opener: calls, or text


def reasoning_regex(fmt: ReasoningFormat, then: str) -> str:
    """Thinking (free, up to the closer), at most two spaces or newlines, then the answer
    matching `then` (unbounded whitespace would let a small model loop on it)."""
    thinking = avoid_regex(fmt.closer) + escape_literal(fmt.closer) + r"[ \n]{0,2}"
    if fmt.starts_inside:
        return f"(?:{escape_literal(fmt.opener)})?{thinking}(?:{then})"
    return f"(?:{escape_literal(fmt.opener)}{thinking})?(?:{then})"


def parse_reasoning_constraint(text: str) -> tuple[ReasoningFormat, tuple[str, Any]]:
    """The pattern of a "reasoning" constraint (SamplingParams.constraint writes it): the
    format's thinking, then the wrapped (kind, pattern)."""
    spec = json.loads(text)
    kind, inner = spec["then"]
    if kind == "reasoning":
        raise ValueError("a reasoning constraint cannot wrap another")
    return reasoning_format(spec["format"]), (kind, tuple(inner) if kind == "choices" else inner)


def spec_summary(spec: ToolCallSpec) -> dict[str, Any]:
    return {"format": spec.format.name, "mode": spec.mode, "parallel": spec.parallel,
            "tools": [n for n, _ in spec.tools]}
