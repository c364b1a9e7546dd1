"""GrammarCompiler: constraint -> Grammar through the engine its kind runs on, with a bounded
LRU cache, compilation on background threads, and (for the process trio) a folder where the
tokenizer process leaves compiled grammars for the worker to load.

Which engine: `grammar_backend` names one for every kind, or "auto" picks per kind by measured
coverage and speed (benchmarks/grammar_engines.py): llguidance for JSON schemas (compiles in
milliseconds, covers more schemas, refuses what it cannot enforce), outlines-core for regexes,
choices and tool calls (its precomputed DFA masks those cheaper). Context-free grammars (ebnf,
lark) run on llguidance whatever the backend: it is the only engine that takes them."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixrt.runtime.config import (
    DEFAULT_GRAMMAR_BACKEND,
    GRAMMAR_BACKENDS,
    JSON_WHITESPACE_PATTERN,
)
from radixrt.runtime.constrained.grammar import END_MARKER, OUTLINES_ENGINE
from radixrt.runtime.constrained.grammar_engine import Constraint, Grammar, GrammarEngine
from radixrt.runtime.constrained.token_table import TokenTable

GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per process (LRU)
GRAMMAR_COMPILE_THREADS = 2  # grammars compile off the hot path on this many threads
LLGUIDANCE = "llguidance"
CFG_KINDS = ("ebnf", "lark")  # only llguidance takes them
AUTO_ENGINES = {"json_schema": LLGUIDANCE}  # "auto": these kinds on llguidance, the rest outlines


def constraint_kind(constraint: Constraint) -> str:
    """The kind that decides the engine: a reasoning constraint's is the one it wraps."""
    kind, pattern = constraint
    if kind == "reasoning":
        try:
            return str(json.loads(str(pattern))["then"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            return kind  # the engine's check names the problem
    return kind


def engine_for(backend: str, kind: str) -> str:
    """The engine a constraint of this kind runs on under the backend."""
    if kind in CFG_KINDS:
        return LLGUIDANCE
    if backend == "auto":
        return AUTO_ENGINES.get(kind, OUTLINES_ENGINE)
    return backend


def make_engine(name: str, table: TokenTable) -> GrammarEngine:
    if name == OUTLINES_ENGINE:
        from radixrt.runtime.constrained.outlines_engine import OutlinesEngine

        return OutlinesEngine(table)
    from radixrt.runtime.constrained.llguidance_engine import LLGuidanceEngine

    return LLGuidanceEngine(table)


class GrammarCompiler:
    def __init__(self, table: TokenTable, store_dir: str | os.PathLike | None = None,
                 capacity: int = GRAMMAR_CACHE_SIZE,
                 backend: str = DEFAULT_GRAMMAR_BACKEND) -> None:
        if backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend {backend!r} is unknown: use one of "
                             f"{list(GRAMMAR_BACKENDS)}")
        self.table = table
        self.backend = backend
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.capacity = capacity
        self._engines: dict[str, GrammarEngine] = {}
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(GRAMMAR_COMPILE_THREADS, thread_name_prefix="grammar")
        self.compiled = 0  # how many times a grammar was actually compiled (cache misses)

    def engine(self, constraint: Constraint) -> GrammarEngine:
        """The engine that runs this constraint (made on first use)."""
        name = engine_for(self.backend, constraint_kind(constraint))
        with self._lock:
            engine = self._engines.get(name)
            if engine is None:
                engine = self._engines[name] = make_engine(name, self.table)
            return engine

    def key(self, constraint: Constraint) -> str:
        kind, pattern = constraint
        name = engine_for(self.backend, constraint_kind(constraint))
        text = "\0".join([kind, repr(pattern), self.table.identity, JSON_WHITESPACE_PATTERN,
                          f"end-marker-{END_MARKER}", name])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def check(self, constraint: Constraint) -> Any:
        """What the engine compiles. Raises ValueError naming what is wrong."""
        return self.engine(constraint).check(constraint)

    def compile_async(self, constraint: Constraint) -> Future:
        """Future of the Grammar. A cached grammar comes back done; otherwise the constraint is
        checked here (ValueError naming the problem) and compiled on a thread."""
        key = self.key(constraint)
        with self._lock:
            known = self._known(key)
        if known is not None:
            return known
        engine = self.engine(constraint)
        checked = engine.check(constraint)
        with self._lock:
            known = self._known(key)
            if known is None:
                known = self._pool.submit(self._compile, engine, key, checked)
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

    def get(self, constraint: Constraint) -> Grammar:
        return self.compile_async(constraint).result()

    def load(self, key: str, constraint: Constraint) -> Grammar:
        """The worker's way in: from the cache, else what the tokenizer process left in the
        store, else compile here."""
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        grammar = self.engine(constraint).load(key, constraint, self.store_dir)
        if grammar is not None:
            self._remember(key, grammar)
            return grammar
        return self.get(constraint)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- internals ----------------------------------------------------------------------------
    def _compile(self, engine: GrammarEngine, key: str, checked: Any) -> Grammar:
        try:
            grammar = engine.compile(key, checked)
            self.compiled += 1
            engine.save(grammar, self.store_dir)
            self._remember(key, grammar)
            return grammar
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _remember(self, key: str, grammar: Grammar) -> None:
        with self._lock:
            self._cache[key] = grammar
            self._cache.move_to_end(key)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
