"""The GrammarCompiler: a failed constraint fails at once the next time (its error, or its
timeout, remembered); the cache bounded in grammars and in bytes; the check on the caller's
thread (the Engine) or on the compile thread (a server's event loop never runs it); an evicted
grammar loaded from the store folder, not compiled again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from grammar_masks import allowed
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.index_process import GrammarTimeout
from radixrt.runtime.constrained.token_table import TokenTable

SLOW = "[ab]*a[ab]{17}"


@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(["abab baba aabb yes no"] * 4, 300)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


@pytest.fixture
def outlines(table: TokenTable) -> Iterator[GrammarCompiler]:
    compiler = GrammarCompiler(table, backend="outlines", timeout_s=1.0, check_inline=False)
    yield compiler
    compiler.close()


def test_a_timed_out_constraint_fails_at_once_the_next_time(outlines: GrammarCompiler) -> None:
    with pytest.raises(GrammarTimeout, match="1 s, --grammar-compile-timeout"):
        outlines.get(("regex", SLOW))
    start = time.monotonic()
    future = outlines.compile_async(("regex", SLOW))
    assert future.done() and isinstance(future.exception(), GrammarTimeout)
    assert time.monotonic() - start < 0.1
    assert outlines.get(("regex", "yes|no")).key  # others still compile


def test_the_check_runs_where_the_compiler_is_told(table: TokenTable,
                                                   outlines: GrammarCompiler) -> None:
    future = outlines.compile_async(("regex", "(ab"))  # off the caller's thread: no raise here
    with pytest.raises(ValueError, match="is invalid"):
        future.result(timeout=60)
    inline = GrammarCompiler(table, backend="llguidance")
    try:
        with pytest.raises(ValueError, match="regex is invalid: unclosed group"):
            inline.compile_async(("regex", "(ab"))
    finally:
        inline.close()


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_the_cache_is_bounded_in_bytes(table: TokenTable, backend: str) -> None:
    compiler = GrammarCompiler(table, backend=backend)
    try:
        sizes = [compiler.get(("regex", f"(yes|no){{{n}}}")).nbytes for n in range(1, 5)]
        assert all(size > 0 for size in sizes)
        assert compiler.cached_bytes == sum(sizes)
        bounded = GrammarCompiler(table, backend=backend, max_bytes=max(sizes))
        try:
            for n in range(1, 5):
                bounded.get(("regex", f"(yes|no){{{n}}}"))
                assert bounded.cached_bytes <= max(sizes)
            assert bounded.compiled == 4
            bounded.get(("regex", "(yes|no){4}"))  # the newest is kept
            assert bounded.compiled == 4
        finally:
            bounded.close()
    finally:
        compiler.close()


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_an_evicted_grammar_is_loaded_from_the_store_not_compiled(table: TokenTable,
                                                                  backend: str,
                                                                  tmp_path: Path) -> None:
    """What the worker asks for after the cache dropped it comes from the store folder (the
    Engine's and the server's): no compile inside a step, and the same language."""
    compiler = GrammarCompiler(table, tmp_path, capacity=1, backend=backend)
    try:
        first = ("regex", "(yes|no) (abab|baba)")
        key = compiler.key(first)
        compiler.get(first)
        compiler.get(("regex", "aabb|bbaa"))  # evicts the first
        assert compiler.compiled == 2 and compiler.cached_bytes > 0
        loaded = compiler.load(key, first)
        assert compiler.compiled == 2  # loaded, not compiled
        state = loaded.new_state()
        for token in table.tokenizer.encode("no baba", add_special_tokens=False):
            assert token in allowed(state)
            state.advance(token)
        assert state.accepts_end()
        fresh = GrammarCompiler(table, tmp_path, backend=backend)  # another process's view
        try:
            assert fresh.load(key, first).key == key and fresh.compiled == 0
        finally:
            fresh.close()
    finally:
        compiler.close()
