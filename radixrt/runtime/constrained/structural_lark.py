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
    """Inside a character class ECMA-262 reads `[` and doubled `&&` / `--` / `~~` as literal
    characters, where Rust's regex opens a nested class or a set operation: those are escaped
    (`[[a-z]*]` is a class of "[", "a".."z" and "*" followed by "]" in ECMA, as in the result)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if not in_class:
            if pattern.startswith("[]", i):  # ECMA: a class of nothing
                out.append(EMPTY_CLASS)
                i += 1
            elif pattern.startswith("[^]", i):  # ECMA: a class of everything
                out.append(ANY_CLASS)
                i += 2
            elif c == "[":
                in_class = True
                out.append(c)
                if pattern.startswith("^", i + 1):
                    out.append("^")
                    i += 1
            else:
                out.append(c)
        elif c == "]":
            in_class = False
            out.append(c)
        elif c == "[":
            out.append("\\[")
        elif c in "&-~" and pattern.startswith(c, i + 1):
            out.append(c + "\\" + c)
            i += 1
        else:
            out.append(c)
        i += 1
    return "".join(out)


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
