"""The outlines-core engine: every constraint becomes a regex (JSON schemas through
json_bounds.py, tool calls and reasoning through structural.py), indexed over the vocabulary
into a DFA whose allowed tokens per state are precomputed (grammar.py walks it).

Indexing is slow for big automata (seconds), so compiled indexes are left in the store folder
(outlines-core's own binary format) for the worker process to load."""

from __future__ import annotations

import os
import re
from pathlib import Path

from outlines_core import Index, Vocabulary

from radixrt.runtime.config import JSON_WHITESPACE_PATTERN
from radixrt.runtime.constrained.grammar import (
    END_MARKER,
    OUTLINES_ENGINE,
    CompiledGrammar,
    end_marker_token,
)
from radixrt.runtime.constrained.grammar_engine import Constraint, GrammarEngine
from radixrt.runtime.constrained.json_bounds import schema_to_regex
from radixrt.runtime.constrained.structural import (
    escape_literal,
    parse_reasoning_constraint,
    parse_tool_call_spec,
    reasoning_regex,
    tool_calls_regex,
)
from radixrt.runtime.constrained.token_table import TokenTable

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


class OutlinesEngine(GrammarEngine):
    name = OUTLINES_ENGINE
    kinds = ("regex", "choices", "json_schema", "tool_calls", "reasoning")

    def __init__(self, table: TokenTable) -> None:
        super().__init__(table)
        # any byte is a token here: compiling against it checks a regex's syntax in milliseconds
        self._byte_vocab = Vocabulary(256, {bytes([b]): [b] for b in range(256)})

    def validate(self, constraint: Constraint) -> str:
        """The regex of a constraint, checked for syntax. Raises ValueError naming the problem."""
        regex = to_regex(constraint)
        what = f"{constraint[0]} {_short(constraint[1])}"
        try:  # the engine that will run it decides (Rust regex syntax: \p{L} is fine) ...
            Index(regex, self._byte_vocab)
        except (ValueError, RuntimeError) as exc:
            try:  # ... and where both refuse it, Python's parser names the problem better
                re.compile(regex)
            except re.error as py_exc:
                raise ValueError(f"{what} is invalid: {py_exc}") from None
            raise ValueError(f"{what} cannot be compiled: {exc}") from None
        return regex

    def check(self, constraint: Constraint) -> tuple[str, bool]:
        r"""(the regex to index, whether it ends with the end marker: grammar.py). A pattern the
        marker cannot follow (an end anchor `$` / `\z`, a trailing `(?x)` comment) is indexed
        as it is, with outlines-core's own final states. Raises ValueError as validate does."""
        regex = self.validate(constraint)
        if end_marker_token(self.table) is None:
            return regex, False
        marked = f"(?:{regex})\\x{END_MARKER:02x}"
        try:
            if Index(marked, self._byte_vocab).get_final_states():
                return marked, True
        except (ValueError, RuntimeError):
            pass
        return regex, False

    def compile(self, key: str, checked: tuple[str, bool]) -> CompiledGrammar:
        regex, marked = checked
        return CompiledGrammar(key, Index(regex, self.table.vocabulary), self.table, marked)

    def load(self, key: str, constraint: Constraint, store: Path | None) -> CompiledGrammar | None:
        path = _path(store, key)
        if path is None or not path.exists():
            return None
        with open(path, "rb") as f:  # outlines-core's own binary format, not a pickle
            index = Index.from_binary(f.read())
        return CompiledGrammar(key, index, self.table, self.check(constraint)[1])

    def save(self, grammar: CompiledGrammar, store: Path | None) -> None:  # type: ignore[override]
        path = _path(store, grammar.key)
        if path is None or path.exists():
            return
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_index_bytes(grammar.index))
        os.replace(tmp, path)


def _path(store: Path | None, key: str) -> Path | None:
    if store is None:
        return None
    store.mkdir(parents=True, exist_ok=True)
    return store / f"{key}.index"


def _index_bytes(index: Index) -> bytes:
    """outlines-core's serialisation of an Index (what its pickle support wraps)."""
    loader, (data,) = index.__reduce__()
    assert loader == Index.from_binary and isinstance(data, bytes)
    return data


def _short(pattern: object, limit: int = 80) -> str:
    text = repr(pattern)
    return text if len(text) <= limit else text[: limit - 3] + "..."
