"""outlines-core's compile in a child process: a compile past the limit is stopped (the child
killed, the next job served by a fresh one) and refused naming the flag; a refused constraint
comes back as the check's message; the vocabulary and the jobs cross as msgspec bytes."""

from __future__ import annotations

import time

import msgspec
import pytest
from outlines_core import Index
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.index_process import (
    GrammarTimeout,
    IndexProcess,
    VocabularySpec,
    vocabulary_spec,
)
from radixrt.runtime.constrained.token_table import TokenTable

SLOW = "[ab]*a[ab]{17}"  # a DFA of 2^18 states: many seconds on any vocabulary


@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(["abab baba aabb"] * 4, 300)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


def test_a_compile_past_the_limit_is_stopped_and_the_next_one_served(table: TokenTable) -> None:
    proc = IndexProcess(vocabulary_spec(table))
    try:
        reply = proc.build("regex", "ab|ba", timeout_s=60)
        assert reply.marked and not reply.error
        assert Index.from_binary(reply.index).get_final_states()
        start = time.monotonic()
        with pytest.raises(GrammarTimeout, match="--grammar-compile-timeout"):
            proc.build("regex", SLOW, timeout_s=1.0)
        assert time.monotonic() - start < 10
        again = proc.build("choices", ("yes", "no"), timeout_s=60)  # a fresh child
        assert again.index and not again.error
    finally:
        proc.close()


def test_a_refused_constraint_comes_back_as_its_message(table: TokenTable) -> None:
    proc = IndexProcess(vocabulary_spec(table))
    try:
        assert "is invalid" in proc.build("regex", "(ab", timeout_s=60).error
    finally:
        proc.close()


def test_the_vocabulary_crosses_as_msgspec(table: TokenTable) -> None:
    spec = vocabulary_spec(table)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=VocabularySpec)
    assert back == spec and spec.eos_token_id == table.eos_token_id
    assert sum(len(ids) for _, ids in spec.entries) == sum(
        data is not None for data in table.token_bytes)
