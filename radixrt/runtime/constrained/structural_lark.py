"""Tool-call and reasoning grammars in Lark, for the llguidance engine: the same languages as
structural.py's regexes, with each tool's arguments compiled by llguidance's own JSON-schema
compiler (`%json`) instead of a regex.

llguidance's lexer is greedy and never backtracks, so text that may be followed by a block is
one terminal with the block's opener in it (free text that never contains the opener, then the
opener), beside the terminal of text that ends the output."""

from __future__ import annotations

import json

from radixrt.runtime.constrained.json_one_of import one_of_as_any_of
from radixrt.runtime.constrained.schema_walk import map_subschemas
from radixrt.runtime.constrained.structural import (
    ReasoningFormat,
    ToolCallSpec,
    avoid_regex,
    escape_literal,
)

LLGUIDANCE_JSON_OPTIONS = {"whitespace_flexible": False}  # compact, as json_bounds.py writes it


def lark_literal(text: str) -> str:
    """A Lark string literal for text."""
    return json.dumps(text, ensure_ascii=False)


def lark_regex(regex: str) -> str:
    """A Lark regex terminal for regex (Rust syntax, as llguidance reads it)."""
    return "/" + regex.replace("/", "\\/") + "/"


def json_schema_with_options(schema: str) -> dict:
    """The schema as llguidance compiles it here: compact JSON (options under "x-guidance"),
    and objects closed where the schema lists properties and says nothing of others, as the
    outlines-core path and OpenAI's structured outputs read them (a small model otherwise
    invents keys until max_tokens); a oneOf whose branches are provably disjoint as an anyOf
    (json_one_of.py); patterns as ECMA-262 reads them. ValueError for what is not a schema
    object."""
    value = json.loads(schema)
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ValueError("a JSON schema must be an object (or true)")
    value = ecma_patterns(close_objects(one_of_as_any_of(value)))  # oneOf: read as written
    return {**value, "x-guidance": {**LLGUIDANCE_JSON_OPTIONS, **value.get("x-guidance", {})}}


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
EMPTY_CLASS = r"[^\x00-\x{10FFFF}]"  # ECMA-262's "[]" in Rust's syntax
ANY_CLASS = r"[\s\S]"  # ECMA-262's "[^]"
# ECMA-262's \d, \w and \s (ASCII digits and word characters, its own white space and line
# terminators), and what "." leaves out: Rust's are Unicode's, and its "." only leaves out \n
ECMA_CLASS_ESCAPES = {
    "d": "0-9", "w": "A-Za-z0-9_",
    "s": "\\t\\n\\x0B\\f\\r \\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
         "\\x{205F}\\x{3000}\\x{FEFF}",
}
ECMA_LINE_TERMINATORS = "\\n\\r\\x{2028}\\x{2029}"


def close_objects(node: object) -> object:
    """A copy of a schema where every object schema with properties and none of the keys
    that admit others gets additionalProperties false (allOf branches are left open: each
    branch lists only its part of the properties; so is an object that requires a key it does
    not list, which closing would make unsatisfiable)."""
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, close_objects, skip=("allOf",))
    listed = out.get("properties")
    required = out.get("required", [])
    if (isinstance(listed, dict) and "allOf" not in out and not any(k in out for k in _OPEN_KEYS)
            and isinstance(required, list) and set(required) <= set(listed)):
        out["additionalProperties"] = False
    return out


def ecma_patterns(node: object) -> object:
    """A copy of a schema whose `pattern`s and `patternProperties` keys (ECMA-262 regexes, as
    JSON Schema defines them) say in llguidance's Rust syntax what they say in ECMA-262."""
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, ecma_patterns)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = ecma_to_rust_regex(out["pattern"])
    if isinstance(out.get("patternProperties"), dict):
        out["patternProperties"] = {ecma_to_rust_regex(k): v
                                    for k, v in out["patternProperties"].items()}
    return out


def ecma_to_rust_regex(pattern: str) -> str:
    """An ECMA-262 regex (JSON Schema's) in Rust's syntax (llguidance's), meaning the same:
    \\d \\w \\s and "." as ECMA-262 defines them, \\uXXXX as \\x{XXXX}, and each character
    class parsed into its atoms and ranges, every literal "[", "-", "&", "~", "^" in it escaped
    (Rust reads them as nested classes and set operations), "[]" and "[^]" as ECMA-262 reads
    them. A pattern cut short is left for the engine to refuse."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            text, i, _ = _escape(pattern, i, in_class=False)
            out.append(text)
        elif c == ".":
            out.append(f"[^{ECMA_LINE_TERMINATORS}]")
            i += 1
        elif c == "[":
            text, i = _ecma_class(pattern, i)
            out.append(text)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int, bool]:
    """The escape at pattern[i] ("\\") in Rust's syntax, where it ends, and whether it is a set
    (\\d, \\W, ...) rather than one character."""
    e = pattern[i + 1: i + 2]
    if e.lower() in ECMA_CLASS_ESCAPES and e:
        body = ECMA_CLASS_ESCAPES[e.lower()]
        if e.islower():
            return (body if in_class else f"[{body}]"), i + 2, True
        return f"[^{body}]", i + 2, True  # a nested class inside a class: Rust has them
    hex4 = pattern[i + 2: i + 6]
    if e == "u" and len(hex4) == 4 and all(h in "0123456789abcdefABCDEF" for h in hex4):
        return f"\\x{{{hex4}}}", i + 6, False
    if e == "b" and in_class:  # ECMA-262: a backspace inside a class
        return "\\x08", i + 2, False
    return pattern[i: i + 2], i + 2, False


def _ecma_class(pattern: str, i: int) -> tuple[str, int]:
    """The class starting at pattern[i] ("[") in Rust's syntax, and where it ends."""
    j = i + 1
    negated = pattern.startswith("^", j)
    j += negated
    if pattern.startswith("]", j):  # ECMA-262: "[]" matches nothing, "[^]" anything
        return (ANY_CLASS if negated else EMPTY_CLASS), j + 1
    items: list[str] = []
    while j < len(pattern) and pattern[j] != "]":
        first, j, first_set = _class_atom(pattern, j)
        if (pattern.startswith("-", j) and j + 1 < len(pattern) and pattern[j + 1] != "]"
                and not first_set):
            last, k, last_set = _class_atom(pattern, j + 1)
            if not last_set:
                items.append(f"{first}-{last}")
                j = k
                continue
        items.append(first)
    if j >= len(pattern):
        return pattern[i:], len(pattern)  # unterminated: the engine names the error
    return "[" + ("^" if negated else "") + "".join(items) + "]", j + 1


def _class_atom(pattern: str, j: int) -> tuple[str, int, bool]:
    if pattern[j] == "\\":
        return _escape(pattern, j, in_class=True)
    c = pattern[j]
    return ("\\" + c if c in "[-&~^" else c), j + 1, False


def tool_calls_lark(spec: ToolCallSpec) -> str:
    fmt = spec.format
    calls = " | ".join(
        f"{lark_literal(fmt.call_prefix(name))} %json {json.dumps(json_schema_with_options(p))}"
        ' "}"'
        for name, p in spec.tools)
    block = f"{lark_literal(fmt.opener)} call {lark_literal(fmt.closer)}" if fmt.opener else \
        f"call {lark_literal(fmt.closer)}" if fmt.closer else "call"
    rest = f"({lark_literal(fmt.separator)} {block})*" if spec.parallel else ""
    lines = [f"call: {calls}"] if spec.tools and spec.mode != "none" else []
    if fmt.trigger:
        text = avoid_regex(fmt.trigger)
        lines.append(f"TEXT: {lark_regex(text)}")
        if spec.mode == "none" or not spec.tools:
            start = "TEXT?"
        elif spec.mode == "required":
            start = f"{block} {rest}"
        else:  # auto: free text, or free text up to and with the opener, then the calls
            after_open = f"call {lark_literal(fmt.closer)} {rest}"
            lines.append(f"TEXT_OPEN: {lark_regex(text + escape_literal(fmt.opener))}")
            start = f"TEXT? | TEXT_OPEN {after_open}"
    else:  # no opener (Llama-3 JSON): calls are the whole output, else text not starting "{"
        lines.append(r"TEXT: /[ \t\n\r]*[^{ \t\n\r][\s\S]*|[ \t\n\r]+/")
        if spec.mode == "none" or not spec.tools:
            start = "TEXT?"
        elif spec.mode == "required":
            start = f"{block} {rest}"
        else:
            start = f"{block} {rest} | TEXT?"
    return "\n".join([f"start: {start}", *lines]) + "\n"


def reasoning_lark(fmt: ReasoningFormat, inner: str) -> str:
    """Thinking (free up to the closer, then at most two spaces or newlines) before the
    grammar called `inner` in the same grammar list."""
    thinking = avoid_regex(fmt.closer) + escape_literal(fmt.closer) + r"[ \n]{0,2}"
    opener = escape_literal(fmt.opener)
    if fmt.starts_inside:
        return f"start: THINK @{inner}\nTHINK: {lark_regex(f'(?:{opener})?{thinking}')}\n"
    return f"start: THINK? @{inner}\nTHINK: {lark_regex(opener + thinking)}\n"
