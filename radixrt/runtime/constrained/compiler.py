"""GrammarCompiler: constraint -> Grammar through the engine its kind runs on, with an LRU
cache bounded in grammars and in bytes, compilation on background threads within a time limit
(a constraint that failed, by its error or its time, fails at once the next time), and (for
the process trio) a folder where the tokenizer process leaves compiled grammars for the worker
to load.

Where the check runs: the Engine checks at submit (a ValueError before anything is queued, on
the caller's thread); the server's tokenizer process checks on the compile threads, never on
its event loop (the error arrives with the grammar future, before the response starts: a 400).

Which engine: `grammar_backend` names one for every kind, or "auto" picks per kind by measured
coverage and speed (benchmarks/json_schema_bench.py): llguidance for JSON schemas (compiles in
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

from radixrt.runtime.config import (
    DEFAULT_GRAMMAR_BACKEND,
    DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S,
    GRAMMAR_BACKENDS,
    JSON_WHITESPACE_PATTERN,
)
from radixrt.runtime.constrained.grammar import END_MARKER, OUTLINES_ENGINE
from radixrt.runtime.constrained.grammar_engine import Constraint, Grammar, GrammarEngine
from radixrt.runtime.constrained.token_table import TokenTable

GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per process (LRU) ...
GRAMMAR_CACHE_BYTES = 2 << 30  # ... and at most this many bytes of them (the newest is kept)
FAILED_CACHE_SIZE = 256  # constraints remembered as failed (their error is raised again)
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

        return OutlinesEngine(table, processes=GRAMMAR_COMPILE_THREADS)
    from radixrt.runtime.constrained.llguidance_engine import LLGuidanceEngine

    return LLGuidanceEngine(table)


class GrammarCompiler:
    def __init__(self, table: TokenTable, store_dir: str | os.PathLike | None = None,
                 capacity: int = GRAMMAR_CACHE_SIZE,
                 backend: str = DEFAULT_GRAMMAR_BACKEND,
                 timeout_s: float = DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S,
                 max_bytes: int = GRAMMAR_CACHE_BYTES, check_inline: bool = True) -> None:
        """timeout_s: a compile past it fails (GrammarTimeout). check_inline: compile_async
        checks the constraint on the caller's thread (the Engine) or on the compile thread (a
        server's event loop)."""
        if backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend {backend!r} is unknown: use one of "
                             f"{list(GRAMMAR_BACKENDS)}")
        self.table = table
        self.backend = backend
        self.store_dir = Path(store_dir) if store_dir is not None else None
        if self.store_dir is not None:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.check_inline = check_inline
        self._bytes = 0  # of the cached grammars
        self._failed: OrderedDict[str, ValueError] = OrderedDict()
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

    def cached(self, constraint: Constraint) -> bool:
        """Is this constraint's grammar compiled already (in the cache)?"""
        key = self.key(constraint)
        with self._lock:
            return key in self._cache

    def compile_async(self, constraint: Constraint) -> Future:
        """Future of the Grammar. A cached grammar comes back done, a failed one failed;
        otherwise the constraint is checked (here with check_inline: a ValueError naming the
        problem) and compiled on a thread (its ValueError / GrammarTimeout in the future)."""
        key = self.key(constraint)
        with self._lock:
            known = self._known(key)
        if known is not None:
            return known
        engine = self.engine(constraint)
        if self.check_inline:
            engine.check(constraint, self.timeout_s)
        with self._lock:
            known = self._known(key)
            if known is None:
                known = self._pool.submit(self._compile, engine, key, constraint)
                self._inflight[key] = known
            return known

    def _known(self, key: str) -> Future | None:
        """A done future for a cached or failed grammar, or the one compiling it (hold the
        lock)."""
        cached = self._cache.get(key)
        failed = self._failed.get(key)
        if cached is None and failed is None:
            return self._inflight.get(key)
        done: Future = Future()
        if cached is not None:
            self._cache.move_to_end(key)
            done.set_result(cached)
        else:
            done.set_exception(failed)
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
        grammar = self.engine(constraint).load(key, self.store_dir)
        if grammar is not None:
            self._remember(key, grammar)
            return grammar
        return self.get(constraint)

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached grammars (read under the lock: never between a grammar's arrival
        and the evictions it causes)."""
        with self._lock:
            return self._bytes

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for engine in self._engines.values():
            engine.close()

    # --- internals ----------------------------------------------------------------------------
    def _compile(self, engine: GrammarEngine, key: str, constraint: Constraint) -> Grammar:
        try:
            grammar = engine.compile(key, constraint, self.timeout_s, self.store_dir)
        except ValueError as exc:
            with self._lock:
                self._failed[key] = exc
                while len(self._failed) > FAILED_CACHE_SIZE:
                    self._failed.popitem(last=False)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
        self.compiled += 1
        self._remember(key, grammar)
        return grammar

    def _remember(self, key: str, grammar: Grammar) -> None:
        with self._lock:
            old = self._cache.pop(key, None)
            self._bytes -= old.nbytes if old is not None else 0
            self._cache[key] = grammar
            self._bytes += grammar.nbytes
            while len(self._cache) > 1 and (len(self._cache) > self.capacity
                                            or self._bytes > self.max_bytes):
                _, evicted = self._cache.popitem(last=False)
                self._bytes -= evicted.nbytes
