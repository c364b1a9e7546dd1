"""The outlines-core engine: every constraint becomes a regex (JSON schemas through
json_bounds.py, tool calls and reasoning through structural.py), indexed over the vocabulary
into a DFA whose allowed tokens per state are precomputed (grammar.py walks it).

Indexing is slow for big automata (seconds to minutes), so it runs in a child process the
compiler can stop at its time limit (index_process.py), and compiled indexes are left in the
store folder (outlines-core's own binary format, after a byte saying whether the end marker
was appended) for the worker process to load."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from outlines_core import Index

from radixrt.runtime.constrained.grammar import OUTLINES_ENGINE, CompiledGrammar
from radixrt.runtime.constrained.grammar_engine import (
    Constraint,
    GrammarEngine,
    store_path,
    write_atomically,
)
from radixrt.runtime.constrained.index_process import (
    IndexProcess,
    IndexReply,
    vocabulary_spec,
)
from radixrt.runtime.constrained.token_table import TokenTable

INDEX_SUFFIX = ".index"  # a store file: the end-marker byte, then outlines-core's binary index


class OutlinesEngine(GrammarEngine):
    name = OUTLINES_ENGINE

    def __init__(self, table: TokenTable, processes: int) -> None:
        """processes: at most this many compile processes (one per compile thread)."""
        super().__init__(table)
        self._spec = vocabulary_spec(table)
        self._idle: queue.SimpleQueue[IndexProcess] = queue.SimpleQueue()
        self._all: list[IndexProcess] = []
        self._max = processes
        self._lock = threading.Lock()

    def check(self, constraint: Constraint, timeout_s: float) -> None:
        """In a compile process too: a pattern's check builds an automaton, which can take as
        long as its index."""
        self._build(constraint, timeout_s, check_only=True)

    def compile(self, key: str, constraint: Constraint, timeout_s: float,
                store: Path | None) -> CompiledGrammar:
        reply = self._build(constraint, timeout_s, check_only=False)
        path = store_path(store, key, INDEX_SUFFIX)
        if path is not None and not path.exists():
            write_atomically(path, (b"M" if reply.marked else b"U") + reply.index)
        grammar = CompiledGrammar(key, Index.from_binary(reply.index), self.table, reply.marked)
        grammar.nbytes = len(reply.index)
        return grammar

    def load(self, key: str, store: Path | None) -> CompiledGrammar | None:
        path = store_path(store, key, INDEX_SUFFIX)
        if path is None or not path.exists():
            return None
        with open(path, "rb") as f:  # outlines-core's own binary format, not a pickle
            marked = f.read(1) == b"M"
            data = f.read()
        grammar = CompiledGrammar(key, Index.from_binary(data), self.table, marked)
        grammar.nbytes = len(data)
        return grammar

    def close(self) -> None:
        for proc in self._all:
            proc.close()

    def _build(self, constraint: Constraint, timeout_s: float, check_only: bool) -> IndexReply:
        reply = self._build_in_child(constraint, timeout_s, check_only)
        if reply.error:
            raise ValueError(reply.error)
        return reply

    def _build_in_child(self, constraint: Constraint, timeout_s: float, check_only: bool
                        ) -> IndexReply:
        proc = self._take()
        try:
            return proc.build(constraint[0], constraint[1], timeout_s, check_only)
        finally:
            self._idle.put(proc)

    def _take(self) -> IndexProcess:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self._all) < self._max:
                proc = IndexProcess(self._spec)
                self._all.append(proc)
                return proc
        return self._idle.get()



