"""The worker's grammar rows (a toy byte-level vocabulary, no model): the masks the mask thread
builds beside a forward pass are the masks built inline, row for row, on both engines; rows
without a grammar, or whose grammar has ended, are left alone; and after_sample moves the
grammar and appends jump-forward's tokens within max_tokens. Rows drafted ahead of their state
(speculative decoding) get the masks of the state walked through the drafts, up to the first
drafted token the grammar forbids, and leave the state where it was."""

from __future__ import annotations

import threading

import pytest
import torch
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar_engine import GrammarState
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.worker.grammar_rows import MaskRow, MaskThread, after_sample, allowed_tokens

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
    def states() -> list[MaskRow | None]:
        return [MaskRow(walked(compiler, "regex", REGEX, "red")), None,
                MaskRow(walked(compiler, "regex", REGEX, "")),
                MaskRow(walked(compiler, "json_schema", SCHEMA, "")),
                MaskRow(walked(compiler, "json_schema", SCHEMA, '{"a":1'))]
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
    assert masks.start([None, MaskRow(ended)]) is None
    assert allowed_tokens([None, MaskRow(ended)], compiler.table.vocab_size) is None
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
        pending = masks.start([MaskRow(state)])
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


@pytest.mark.parametrize("kind, pattern, text, draft_text", [
    ("regex", REGEX, "red", " green blue"),
    ("json_schema", SCHEMA, '{"a":', '12}'),
])
def test_drafted_rows_get_the_masks_of_the_walked_state(
        compiler: GrammarCompiler, kind: str, pattern: str, text: str, draft_text: str) -> None:
    """Row j of a draft is masked as the state after the first j drafted tokens would be; the
    state ends where it started."""
    table = compiler.table
    draft = table.tokenizer.encode(draft_text, add_special_tokens=False)
    state = walked(compiler, kind, pattern, text)
    before = state.consumed
    rows = [MaskRow(state, tuple(draft[:j])) for j in range(len(draft) + 1)]
    got = allowed_tokens(rows, table.vocab_size)
    assert state.consumed == before and not state.ended
    assert got is not None and got[0] == list(range(len(draft) + 1))
    for j in range(len(draft) + 1):
        alone = allowed_tokens([MaskRow(walked(compiler, kind, pattern, text)
                                        if j == 0 else _walk(compiler, kind, pattern, text,
                                                             draft[:j]))], table.vocab_size)
        assert alone is not None and torch.equal(got[1][j], alone[1][0]), f"row {j}"


def test_a_forbidden_drafted_token_ends_the_drafts_masks(compiler: GrammarCompiler) -> None:
    table = compiler.table
    good = table.tokenizer.encode(" green", add_special_tokens=False)
    bad = table.tokenizer.encode("7", add_special_tokens=False)
    state = walked(compiler, "regex", REGEX, "red")
    draft = tuple(good + bad + good)
    rows = [MaskRow(state, draft[:j]) for j in range(len(draft) + 1)]
    got = allowed_tokens(rows, table.vocab_size)
    assert got is not None
    assert got[0] == list(range(len(good) + 1))  # rows after the forbidden token: unconstrained
    assert state.consumed == len(table.tokenizer.encode("red", add_special_tokens=False))


def test_a_draft_trees_rows_get_the_masks_of_their_paths(compiler: GrammarCompiler) -> None:
    """Rows of a draft tree (branches part and rejoin the walk): each row is masked as the state
    walked along its own path would be; a branch under a forbidden token is left unconstrained,
    and the state ends where it started."""
    table = compiler.table
    enc = table.tokenizer.encode
    green, blue, bad = (enc(t, add_special_tokens=False) for t in (" green", " blue", "7"))
    state = walked(compiler, "regex", REGEX, "red")
    before = state.consumed
    paths: list[tuple[int, ...]] = [()]  # every prefix of these, in draft order: parents first
    for seq in (green + blue, green + green, bad + green, blue + green):
        paths += [tuple(seq[:n]) for n in range(1, len(seq) + 1) if tuple(seq[:n]) not in paths]
    got = allowed_tokens([MaskRow(state, p) for p in paths], table.vocab_size)
    assert state.consumed == before and not state.ended
    under_bad = [j for j, p in enumerate(paths) if p[: len(bad)] == tuple(bad)]
    assert got is not None and under_bad and got[0] == [j for j in range(len(paths))
                                                        if j not in under_bad]
    for row, j in enumerate(got[0]):
        alone = allowed_tokens([MaskRow(_walk(compiler, "regex", REGEX, "red", list(paths[j])))],
                               table.vocab_size)
        assert alone is not None and torch.equal(got[1][row], alone[1][0]), f"row {j}"


def _walk(compiler: GrammarCompiler, kind: str, pattern: str, text: str,
          more: list[int]) -> GrammarState:
    state = walked(compiler, kind, pattern, text)
    for token in more:
        state.advance(token)
    return state


def test_a_drafted_eos_is_allowed_only_where_the_grammar_may_end(compiler: GrammarCompiler
                                                                  ) -> None:
    """A draft may hold an EOS (a chat prompt's end-of-turn token, drafted from the request's
    own context). Where the grammar cannot end yet it is forbidden like any other token: the
    rows under it are left unconstrained and nothing fails. Where it may end, the grammar ends
    there: no row under it is constrained either. Both states end where they started."""
    table = compiler.table
    eos = table.eos_token_id
    green = table.tokenizer.encode(" green", add_special_tokens=False)[0]
    cannot_end = walked(compiler, "regex", REGEX, "")  # nothing yet: EOS is forbidden
    may_end = walked(compiler, "regex", REGEX, "red")
    rows = [MaskRow(state, ahead) for state in (cannot_end, may_end)
            for ahead in ((), (eos,), (eos, green))]
    got = allowed_tokens(rows, table.vocab_size)
    assert got is not None and got[0] == [0, 3]  # only the rows before each drafted EOS
    assert not got[1][0, eos] and got[1][1, eos]
    assert cannot_end.consumed == 0 and not cannot_end.ended
    assert may_end.consumed == len(table.tokenizer.encode("red", add_special_tokens=False))
    assert not may_end.ended
