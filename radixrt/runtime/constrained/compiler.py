"""GrammarCompiler: regex / JSON schema / choices -> CompiledGrammar, with a bounded LRU cache,
compilation on background threads, and (for the process trio) a directory where the tokenizer
process leaves compiled indexes for the worker to load."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from outlines_core import Index, Vocabulary

from radixrt.runtime.config import JSON_WHITESPACE_PATTERN
from radixrt.runtime.constrained.grammar import END_MARKER, CompiledGrammar, end_marker_token
from radixrt.runtime.constrained.json_bounds import schema_to_regex
from radixrt.runtime.constrained.structural import (
    escape_literal,
    parse_reasoning_constraint,
    parse_tool_call_spec,
    reasoning_regex,
    tool_calls_regex,
)
from radixrt.runtime.constrained.token_table import TokenTable

GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per process (LRU)
GRAMMAR_COMPILE_THREADS = 2  # grammars compile off the hot path on this many threads

Constraint = tuple[str, "str | tuple[str, ...]"]


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
        except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as exc:
            raise ValueError(f"json_schema is invalid: {exc}") from None
    if kind == "tool_calls":
        spec = parse_tool_call_spec(str(pattern))
        try:
            return tool_calls_regex(spec)
        except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as exc:
            raise ValueError(f"tool_calls: a tool's parameters schema is invalid: {exc}") \
                from None
    if kind == "reasoning":  # a thinking section, then the wrapped constraint (if any)
        fmt, inner = parse_reasoning_constraint(str(pattern))
        return reasoning_regex(fmt, to_regex(inner))
    raise ValueError(f"unknown constraint kind {kind!r}")


class GrammarCompiler:
    def __init__(self, table: TokenTable, store_dir: str | os.PathLike | None = None,
                 capacity: int = GRAMMAR_CACHE_SIZE) -> None:
        self.table = table
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.capacity = capacity
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(GRAMMAR_COMPILE_THREADS, thread_name_prefix="grammar")
        # any byte is a token here: compiling against it checks a regex's syntax in milliseconds
        self._byte_vocab = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
        self.compiled = 0  # how many times a grammar was actually compiled (cache misses)

    def key(self, constraint: Constraint) -> str:
        kind, pattern = constraint
        text = "\0".join([kind, repr(pattern), self.table.identity, JSON_WHITESPACE_PATTERN,
                          f"end-marker-{END_MARKER}"])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

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

    def plan(self, constraint: Constraint) -> tuple[str, bool]:
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

    def compile_async(self, constraint: Constraint) -> Future:
        """Future of the CompiledGrammar. A cached grammar comes back done; otherwise the
        constraint is checked here (ValueError naming the problem) and compiled on a thread."""
        key = self.key(constraint)
        with self._lock:
            known = self._known(key)
        if known is not None:
            return known
        regex, marked = self.plan(constraint)
        with self._lock:
            known = self._known(key)
            if known is None:
                known = self._pool.submit(self._compile, key, regex, marked)
                self._inflight[key] = known
            return known

    def _known(self, key: str) -> Future | None:
        """A done future for a cached grammar, or the one compiling it (hold the lock)."""
        cached = self._cache.get(key)
        if cached is None:
            return self._inflight.get(key)
        self._cache.move_to_end(key)
        done: Future = Future()
        done.set_result(cached)
        return done

    def get(self, constraint: Constraint) -> CompiledGrammar:
        return self.compile_async(constraint).result()

    def load(self, key: str, constraint: Constraint) -> CompiledGrammar:
        """The worker's way in: from the cache, else the file the tokenizer process left, else
        compile here."""
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        path = self._path(key)
        if path is not None and path.exists():
            with open(path, "rb") as f:  # outlines-core's own binary format, not a pickle
                index = Index.from_binary(f.read())
            grammar = CompiledGrammar(key, index, self.table, self.plan(constraint)[1])
            self._remember(key, grammar)
            return grammar
        return self.get(constraint)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- internals ----------------------------------------------------------------------------
    def _compile(self, key: str, regex: str, marked: bool) -> CompiledGrammar:
        try:
            index = Index(regex, self.table.vocabulary)
            self.compiled += 1
            path = self._path(key)
            if path is not None and not path.exists():
                tmp = path.with_suffix(".tmp")
                with open(tmp, "wb") as f:
                    f.write(_index_bytes(index))
                os.replace(tmp, path)
            grammar = CompiledGrammar(key, index, self.table, marked)
            self._remember(key, grammar)
            return grammar
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _remember(self, key: str, grammar: CompiledGrammar) -> None:
        with self._lock:
            self._cache[key] = grammar
            self._cache.move_to_end(key)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)

    def _path(self, key: str) -> Path | None:
        if self.store_dir is None:
            return None
        self.store_dir.mkdir(parents=True, exist_ok=True)
        return self.store_dir / f"{key}.index"


def _index_bytes(index: Index) -> bytes:
    """outlines-core's serialisation of an Index (what its pickle support wraps)."""
    loader, (data,) = index.__reduce__()
    assert loader == Index.from_binary and isinstance(data, bytes)
    return data


def _short(pattern: object, limit: int = 80) -> str:
    text = repr(pattern)
    return text if len(text) <= limit else text[: limit - 3] + "..."
