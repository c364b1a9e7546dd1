"""The worker's grammar rows (a toy byte-level vocabulary, no model): the masks the mask thread
builds beside a forward pass are the masks built inline, row for row, on both engines; rows
without a grammar, or whose grammar has ended, are left alone; and after_sample moves the
grammar and appends jump-forward's tokens within max_tokens."""

from __future__ import annotations

import threading

import pytest
import torch
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar_engine import GrammarState
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.worker.grammar_rows import MaskThread, after_sample, allowed_tokens

CORPUS = ["red green blue", "2024-01-31", "abc abd abe", '{"a": 1, "b": [true]}'] * 4
REGEX = r"(red|green|blue)( (red|green|blue)){0,2}"
SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(CORPUS, 300)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


def walked(compiler: GrammarCompiler, kind: str, pattern: str, text: str) -> GrammarState:
    """A state that has taken `text`'s tokens."""
    state = compiler.get((kind, pattern)).new_state()
    for token in compiler.table.tokenizer.encode(text, add_special_tokens=False):
        state.advance(token)
    return state


def test_mask_thread_builds_the_inline_masks(compiler: GrammarCompiler) -> None:
    table = compiler.table
    def states() -> list[GrammarState | None]:
        return [walked(compiler, "regex", REGEX, "red"), None,
                walked(compiler, "regex", REGEX, ""), walked(compiler, "json_schema", SCHEMA, ""),
                walked(compiler, "json_schema", SCHEMA, '{"a":1')]
    inline = allowed_tokens(states(), table.vocab_size)
    masks = MaskThread(table.vocab_size)
    try:
        pending = masks.start(states())
        assert pending is not None
        threaded, timing = pending.result(torch.device("cpu"))
    finally:
        masks.close()
    assert inline is not None and threaded is not None
    assert threaded[0] == inline[0] == [0, 2, 3, 4]  # the row without a grammar is left alone
    assert torch.equal(threaded[1], inline[1])
    assert timing.rows == 4 and timing.seconds > 0 and timing.wait_seconds >= 0
    eos = sorted(table.eos_token_ids)
    assert not inline[1][1, eos].any()  # "" cannot end
    assert inline[1][0, eos].all()  # "red" may end


def test_rows_without_a_live_grammar_start_nothing(compiler: GrammarCompiler) -> None:
    ended = walked(compiler, "regex", REGEX, "blue blue blue")
    ended.advance(compiler.table.eos_token_id)
    masks = MaskThread(compiler.table.vocab_size)
    assert masks.start([None, ended]) is None
    assert allowed_tokens([None, ended], compiler.table.vocab_size) is None
    masks.close()


def test_masks_are_built_on_another_thread(compiler: GrammarCompiler) -> None:
    """The step's own thread is free while the masks are built: it runs the forward pass."""
    state = walked(compiler, "regex", REGEX, "red")
    write_mask = state.write_mask
    threads: list[str] = []

    def recorded(words: torch.Tensor) -> None:  # the real mask, noting the thread it runs on
        threads.append(threading.current_thread().name)
        write_mask(words)

    state.write_mask = recorded  # type: ignore[method-assign]
    masks = MaskThread(compiler.table.vocab_size)
    try:
        pending = masks.start([state])
        assert pending is not None
        allowed, _ = pending.result(torch.device("cpu"))
    finally:
        masks.close()
    assert allowed is not None and len(threads) == 1
    assert threads[0].startswith("radixrt-masks") and threads[0] != threading.current_thread().name


def test_after_sample_appends_forced_tokens_within_max_tokens(compiler: GrammarCompiler
                                                              ) -> None:
    table = compiler.table
    prompt = [1, 2]
    tokens = list(prompt)
    state = compiler.get(("regex", r"abc abd")).new_state()
    first = table.tokenizer.encode("a", add_special_tokens=False)[0]
    tokens.append(first)
    forced = after_sample(state, tokens, len(prompt), max_tokens=3, jump_forward=True)
    assert len(forced) == 2 and tokens[len(prompt):] == [first, *forced]  # cut at max_tokens
    assert after_sample(None, tokens, len(prompt), 3, True) == []
