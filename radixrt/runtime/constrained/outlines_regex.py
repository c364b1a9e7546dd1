"""Constraints as the regexes outlines-core indexes: each kind's regex (JSON schemas through
json_bounds.py, tool calls and reasoning through structural.py), checked for syntax against a
256-byte vocabulary (milliseconds, usually), with the end marker appended where the pattern
lets it follow (grammar.py explains the marker). No torch here: the compile process
(index_process.py) imports only this."""

from __future__ import annotations

import re

from outlines_core import Index, Vocabulary

from radixrt.runtime.config import GRAMMAR_END_MARKER, JSON_WHITESPACE_PATTERN
from radixrt.runtime.constrained.json_bounds import schema_to_regex
from radixrt.runtime.constrained.structural import (
    escape_literal,
    parse_reasoning_constraint,
    parse_tool_call_spec,
    reasoning_regex,
    tool_calls_regex,
)

Constraint = tuple[str, "str | tuple[str, ...]"]
_SCHEMA_ERRORS = (ValueError, TypeError, KeyError, ArithmeticError, RecursionError)


def to_regex(constraint: Constraint) -> str:
    """The regex a constraint means. Raises ValueError for a schema outlines-core cannot use."""
    kind, pattern = constraint
    if kind == "regex":
        return str(pattern)
    if kind == "choices":  # longest first: outlines-core's automaton takes the first alternative
        # that matches, so a choice listed after one it extends ("no", "no way") was unreachable
        ordered = sorted(pattern, key=len, reverse=True)
        return "(" + "|".join(escape_literal(c) for c in ordered) + ")"
    if kind == "json_schema":
        try:
            return schema_to_regex(str(pattern), JSON_WHITESPACE_PATTERN)
        except _SCHEMA_ERRORS as exc:
            raise ValueError(f"json_schema is invalid: {exc}") from None
    if kind == "tool_calls":
        spec = parse_tool_call_spec(str(pattern))
        try:
            return tool_calls_regex(spec)
        except _SCHEMA_ERRORS as exc:
            raise ValueError(f"tool_calls: a tool's parameters schema is invalid: {exc}") \
                from None
    if kind == "reasoning":  # a thinking section, then the wrapped constraint (if any)
        fmt, inner = parse_reasoning_constraint(str(pattern))
        return reasoning_regex(fmt, to_regex(inner))
    if kind in ("ebnf", "lark"):
        raise ValueError(f"{kind} grammars need the llguidance engine (outlines-core takes "
                         "regular languages only)")
    raise ValueError(f"unknown constraint kind {kind!r}")


def validate_regex(constraint: Constraint, byte_vocab: Vocabulary) -> str:
    """The regex of a constraint, checked for syntax. Raises ValueError naming the problem."""
    regex = to_regex(constraint)
    what = f"{constraint[0]} {_short(constraint[1])}"
    try:  # the engine that will run it decides (Rust regex syntax: \p{L} is fine) ...
        Index(regex, byte_vocab)
    except (ValueError, RuntimeError) as exc:
        try:  # ... and where both refuse it, Python's parser names the problem better
            re.compile(regex)
        except re.error as py_exc:
            raise ValueError(f"{what} is invalid: {py_exc}") from None
        raise ValueError(f"{what} cannot be compiled: {exc}") from None
    return regex


def plan_regex(constraint: Constraint, byte_vocab: Vocabulary, has_marker: bool
               ) -> tuple[str, bool]:
    r"""(the regex to index, whether it ends with the end marker: grammar.py). A pattern the
    marker cannot follow (an end anchor `$` / `\z`, a trailing `(?x)` comment) is indexed as it
    is, with outlines-core's own final states. Raises ValueError as validate_regex does."""
    regex = validate_regex(constraint, byte_vocab)
    if not has_marker:
        return regex, False
    marked = f"(?:{regex})\\x{GRAMMAR_END_MARKER:02x}"
    try:
        if Index(marked, byte_vocab).get_final_states():
            return marked, True
    except (ValueError, RuntimeError):
        pass
    return regex, False


def index_bytes(index: Index) -> bytes:
    """outlines-core's serialisation of an Index (what its pickle support wraps)."""
    loader, (data,) = index.__reduce__()
    assert loader == Index.from_binary and isinstance(data, bytes)
    return data


def _short(pattern: object, limit: int = 80) -> str:
    text = repr(pattern)
    return text if len(text) <= limit else text[: limit - 3] + "..."
