"""Compiled grammars on a toy vocabulary whose tokens we choose: the forced-token chains
jump-forward appends, allowed-token masks, accepting and ended states, EOS only where the regex
accepts; the TokenTable built from a tokenizer; the GrammarCompiler's validation and cache."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar import MAX_FORCED_TOKENS, CompiledGrammar, OutlinesState
from radixrt.runtime.constrained.grammar_engine import GrammarState, expand_bitmask, mask_words
from radixrt.runtime.constrained.outlines_regex import to_regex
from radixrt.runtime.constrained.structural import escape_literal
from radixrt.runtime.constrained.token_table import TokenTable

# The toy vocabulary: specials first, then the tokens. BPE merges in rank order: "cd" is merged
# before "ab", so the tokenizer splits "abcd" as ab|cd although "abc" is a longer first match.
SPECIALS = ["<eos>", "<|end|>"]
TOKENS = ["a", "b", "c", "d", "x", "ab", "abc", "cd", "xx"]
MERGES = [("c", "d"), ("a", "b"), ("ab", "c"), ("x", "x")]
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + TOKENS)}
EOS, END = VOCAB["<eos>"], VOCAB["<|end|>"]
VOCAB_SIZE = 16  # padded past the vocabulary, like a model's embedding rows


def T(*pieces: str) -> tuple[int, ...]:
    return tuple(VOCAB[p] for p in pieces)


def bpe_tokenizer(tokens: Sequence[str], merges: Sequence[tuple[str, str]],
                  normalizer: Any = None) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(tokens))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    if normalizer is not None:
        backend.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>",
                                   additional_special_tokens=["<|end|>"])


@pytest.fixture(scope="module")
def table() -> TokenTable:
    return TokenTable(bpe_tokenizer(TOKENS, MERGES), VOCAB_SIZE, [END])


@pytest.fixture(scope="module")
def compiler(table: TokenTable) -> Iterator[GrammarCompiler]:
    comp = GrammarCompiler(table, backend="outlines")
    yield comp
    comp.close()


def grammar_of(compiler: GrammarCompiler, regex: str) -> CompiledGrammar:
    return compiler.get(("regex", regex))


def allowed(grammar: CompiledGrammar, state: int) -> set[int]:
    return set(grammar.index.get_allowed_tokens(state))


def mask_of(state: GrammarState) -> set[int]:
    words = torch.zeros(mask_words(VOCAB_SIZE), dtype=torch.int32)
    state.write_mask(words)
    return set(expand_bitmask(words[None], VOCAB_SIZE)[0].nonzero().flatten().tolist())


def walk(grammar: CompiledGrammar, tokens: Sequence[int]) -> GrammarState:
    return GrammarState.replay(grammar, list(tokens))


# --- TokenTable --------------------------------------------------------------------------------


def test_token_table_of_a_toy_vocabulary(table: TokenTable) -> None:
    assert table.vocab_size == VOCAB_SIZE
    assert table.eos_token_id == EOS and table.eos_token_ids == {EOS, END}
    assert table.token_bytes[EOS] is None and table.token_bytes[END] is None  # specials
    assert table.token_bytes[VOCAB["abc"]] == b"abc"
    assert table.token_bytes[len(VOCAB):] == [None] * (VOCAB_SIZE - len(VOCAB))  # padding rows
    assert table.first_byte[VOCAB["abc"]] == ord("a") and table.first_byte[VOCAB["cd"]] == ord("c")
    assert table.first_byte[EOS] == -1 and table.first_byte[VOCAB_SIZE - 1] == -1
    assert table.byte_token[ord("x")] == VOCAB["x"] and table.byte_token[ord("z")] == -1
    assert table.encode("abcd") == list(T("ab", "cd"))
    assert table.encode("xxx") == list(T("xx", "x"))


def test_token_table_reads_byte_level_and_sentencepiece_pieces() -> None:
    # GPT-2 byte-level pieces: "Ġ" stands for a space, "Ã©" for the two bytes of "é"
    vocab = {"<eos>": 0, "a": 1, "Ġ": 2, "Ġa": 3, "Ã©": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "a")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    table = TokenTable(tok, 5, [])
    assert table.token_bytes == [None, b"a", b" ", b" a", "é".encode()]
    assert table.byte_token[ord(" ")] == 2 and table.first_byte[4] == 0xC3
    # SentencePiece pieces: "▁" is a space, "<0x41>" a byte-fallback token
    vocab = {"<eos>": 0, "▁a": 1, "<0x41>": 2, "b": 3}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])),
                                  eos_token="<eos>")
    table = TokenTable(tok, 4, [])
    assert table.token_bytes == [None, b" a", b"A", b"b"]
    assert table.byte_token[ord("A")] == 2


def test_token_table_identity_tells_vocabularies_apart(table: TokenTable) -> None:
    other = TokenTable(bpe_tokenizer(TOKENS[:-1], MERGES[:-1]), VOCAB_SIZE, [END])
    assert other.identity != table.identity
    assert TokenTable(bpe_tokenizer(TOKENS, MERGES), VOCAB_SIZE, [END]).identity == table.identity


# --- forced tokens (jump-forward) --------------------------------------------------------------


def test_forced_chain_uses_the_tokenizers_own_split(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "abcd")
    state = OutlinesState(g)
    # the model could pick a, ab or abc here; the forced text is tokenized ab|cd as the
    # tokenizer would (longest match would be abc|d), then the end is forced
    assert allowed(g, state.state) == set(T("a", "ab", "abc"))
    assert state.forced() == T("ab", "cd") + (EOS,)


def test_forced_chain_falls_back_to_longest_match() -> None:
    # A tokenizer that lowercases: its split of "ABc" is not the forced bytes, so the chain is
    # the longest match through the automaton instead
    tokens = ["a", "b", "c", "ab", "A", "B", "AB"]
    tok = bpe_tokenizer(tokens, [("a", "b")], normalizer=normalizers.Lowercase())
    table = TokenTable(tok, len(SPECIALS) + len(tokens), [END])
    assert table.encode("ABc") != [table.byte_token[ord(c)] for c in "ABc"]
    comp = GrammarCompiler(table, backend="outlines")
    try:
        ids = {t: i for i, t in enumerate(SPECIALS + tokens)}
        state = OutlinesState(comp.get(("regex", "ABc")))
        assert state.forced() == (ids["AB"], ids["c"], EOS)
    finally:
        comp.close()


def test_forced_chain_leaves_a_token_the_model_could_extend(compiler: GrammarCompiler) -> None:
    # "abx" is forced, but after "ab" the model may also write "xx" (x then the x of the
    # choice): forcing "x" would take that choice away, so only "ab" is forced
    g = grammar_of(compiler, "abx(x|c)")
    assert OutlinesState(g).forced() == T("ab")
    after = walk(g, T("ab"))
    assert allowed(g, after.state) == set(T("x", "xx"))
    assert after.forced() == ()
    # "abc" may be chosen where "ab" is forced bytes and c|d follows: nothing is forced
    assert OutlinesState(grammar_of(compiler, "ab(c|d)")).forced() == ()


def test_nothing_is_forced_at_a_branch(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "(a|c)d")
    state = OutlinesState(g)
    assert state.forced() == ()
    assert allowed(g, state.state) == set(T("a", "c", "cd"))
    state.advance(VOCAB["a"])
    assert state.forced() == (VOCAB["d"], EOS)


def test_an_accepting_state_forces_nothing_and_only_the_end_forces_eos(
        compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "ab(cd)?")
    state = OutlinesState(g)
    assert state.forced() == T("ab")  # no EOS: "abcd" may follow
    state.advance(VOCAB["ab"])
    assert g.index.is_final_state(state.state)
    assert state.forced() == ()  # the output may end here or go on: the model chooses
    state.advance(VOCAB["cd"])
    assert state.forced() == (EOS,)  # nothing but the end is left
    exact = grammar_of(compiler, "ab")
    assert exact.forced_from(OutlinesState(exact).state) == T("ab") + (EOS,)


def test_forced_chain_is_capped(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "x{150}")
    state = OutlinesState(g)
    chain = state.forced()
    assert chain == T("xx") * MAX_FORCED_TOKENS  # capped: no EOS after a cut chain
    for token in chain:
        state.advance(token)
    assert state.forced() == T("xx") * 11 + (EOS,)


def test_forced_chains_are_cached_per_state(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "abcd")
    start = OutlinesState(g).state
    first = g.forced_from(start)
    assert g.forced_from(start) is first


def test_step_by_step_forcing_gives_the_same_tokens(compiler: GrammarCompiler) -> None:
    """Jump-forward off: the mask allows only the first forced token each step; the tokens
    are the chain jump-forward appends at once."""
    g = grammar_of(compiler, "xxabcdx(a|c)")
    jump = OutlinesState(g).forced()
    state = OutlinesState(g)
    steps: list[int] = []
    while state.forced():
        token = state.forced()[0]
        assert token in mask_of(state) or token == EOS
        steps.append(token)
        state.advance(token)
    assert tuple(steps) == jump == T("xx", "ab", "cd", "x")


# --- masks, accepting and ended states ---------------------------------------------------------


@pytest.mark.parametrize("regex", ["abcd", "ab(cd)?", "(a|c)d", "x*", "[ab]+c"])
def test_the_mask_is_the_allowed_set_and_has_eos_only_where_the_regex_accepts(
        compiler: GrammarCompiler, regex: str) -> None:
    g = grammar_of(compiler, regex)
    state = OutlinesState(g)
    for _ in range(6):
        mask = mask_of(state)
        assert mask == allowed(g, state.state)
        assert (EOS in mask) == g.index.is_final_state(state.state)
        assert END not in mask  # outlines-core knows one EOS; the sampler adds the others
        tokens = sorted(mask - {EOS})
        if not tokens:
            break
        state.advance(tokens[-1])


def test_eos_is_refused_where_the_regex_does_not_accept(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "ab(cd)?")
    state = OutlinesState(g)
    with pytest.raises(ValueError, match="EOS where grammar .* does not accept"):
        state.advance(EOS)
    with pytest.raises(ValueError, match="EOS where grammar"):
        state.advance(END)
    assert not state.ended
    state.advance(VOCAB["ab"])
    state.advance(END)  # any of the model's EOS ids ends it where the regex accepts
    assert state.ended and state.forced() == ()
    with pytest.raises(ValueError, match="after the grammar ended"):
        state.advance(VOCAB["cd"])


def test_a_token_outside_the_grammar_is_refused(compiler: GrammarCompiler) -> None:
    state = OutlinesState(grammar_of(compiler, "ab"))
    with pytest.raises(ValueError):
        state.advance(VOCAB["c"])


def test_replay_reaches_the_same_state(compiler: GrammarCompiler) -> None:
    g = grammar_of(compiler, "(ab|cd)+x")
    tokens = T("ab", "cd", "a", "b")
    state = OutlinesState(g)
    for token in tokens:
        state.advance(token)
    again = walk(g, tokens)
    assert again.state == state.state != OutlinesState(g).state
    assert not again.ended and mask_of(again) == mask_of(state)
    assert walk(g, tokens + T("x") + (EOS,)).ended


def test_expand_bitmask_and_mask_words() -> None:
    assert [mask_words(n) for n in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]
    sign = -(2**31)  # bit 31 of an int32 word
    words = torch.tensor([[0b1011 + sign, 0b100], [0, 0b110000000]], dtype=torch.int32)
    mask = expand_bitmask(words, 40)
    assert mask.shape == (2, 40) and mask.dtype == torch.bool
    assert mask[0].nonzero().flatten().tolist() == [0, 1, 3, 31, 34]
    assert mask[1].nonzero().flatten().tolist() == [39]  # bit 8 of word 1 is token 40: cut


# --- property: forced chains on random regexes -------------------------------------------------

ATOMS = st.sampled_from(["a", "b", "c", "d", "x", "[ab]", "[cd]", "(ab)", "(xx)"])
REGEXES = st.recursive(ATOMS, lambda inner: st.one_of(
    st.lists(inner, min_size=1, max_size=4).map("".join),
    st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
    inner.map(lambda r: f"({r})?"),
    st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: f"({t[0]}){{{min(t[1], t[2])},{max(t[1], t[2])}}}"),
), max_leaves=8)


def completions(grammar: CompiledGrammar, table: TokenTable, state: int,
                limit: int) -> tuple[set[bytes], bool]:
    """The texts the grammar accepts from `state` (up to `limit` bytes), and whether longer
    ones exist; walked token by token through the index."""
    done: set[bytes] = set()
    longer = False
    frontier = [(state, b"")]
    while frontier:
        s, text = frontier.pop()
        if grammar.index.is_final_state(s):
            done.add(text)
        tokens = [t for t in grammar.index.get_allowed_tokens(s) if t != EOS]
        if len(text) >= limit:
            longer = longer or bool(tokens)
            continue
        for t in tokens:
            piece = table.token_bytes[t]
            assert piece is not None
            frontier.append((grammar.index.get_next_state(s, t), text + piece))
    return done, longer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regex=REGEXES, choices=st.lists(st.integers(0, 99), max_size=8))
def test_forced_chains_are_what_every_accepted_output_continues_with(
        compiler: GrammarCompiler, table: TokenTable, regex: str, choices: list[int]) -> None:
    g = grammar_of(compiler, regex)
    state = OutlinesState(g)
    for choice in [*choices, None]:
        chain = state.forced()
        s = state.state
        for i, token in enumerate(chain):  # a valid path; EOS only last, where it accepts
            if token == EOS:
                assert i == len(chain) - 1 and g.index.is_final_state(s)
                break
            assert token in allowed(g, s)
            s = g.index.get_next_state(s, token)
        forced_text = b"".join(table.token_bytes[t] or b"" for t in chain if t != EOS)
        texts, longer = completions(g, table, state.state, len(forced_text) + 4)
        assert texts or longer  # never a dead end
        if chain:
            assert all(t.startswith(forced_text) for t in texts), (regex, chain, texts)
            if chain[-1] == EOS:
                assert texts == {forced_text} and not longer
            token = chain[0]  # jump-forward off: the mask allows only this token
        else:
            options = sorted(allowed(g, state.state) - {EOS})
            if choice is None or not options:
                break
            token = options[choice % len(options)]
        state.advance(token)
        if state.ended:
            break
        if chain and len(chain) < MAX_FORCED_TOKENS:
            assert state.forced() == chain[1:], regex  # the same tokens one step later


# --- the compiler ------------------------------------------------------------------------------


def test_the_cache_compiles_a_constraint_once(table: TokenTable) -> None:
    comp = GrammarCompiler(table, backend="outlines")
    try:
        first = comp.get(("regex", "ab+"))
        assert comp.compiled == 1
        future = comp.compile_async(("regex", "ab+"))
        assert future.done() and future.result() is first  # a hit comes back done
        assert comp.get(("regex", "ab+")) is first and comp.compiled == 1
        assert comp.get(("regex", "ab*")) is not first and comp.compiled == 2
        assert comp.get(("choices", ("ab",))) is not first and comp.compiled == 3
    finally:
        comp.close()


def test_concurrent_requests_for_one_grammar_share_one_compile(table: TokenTable) -> None:
    comp = GrammarCompiler(table, backend="outlines")
    try:
        futures = [comp.compile_async(("regex", "(ab|cd){1,5}x")) for _ in range(4)]
        grammars = {id(f.result()) for f in futures}
        assert len(grammars) == 1 and comp.compiled == 1
    finally:
        comp.close()


def test_the_cache_is_lru_bounded(table: TokenTable) -> None:
    comp = GrammarCompiler(table, backend="outlines", capacity=2)
    try:
        a = comp.get(("regex", "a"))
        comp.get(("regex", "b"))
        assert comp.get(("regex", "a")) is a  # a is now the most recent
        comp.get(("regex", "c"))  # evicts b, the least recently used
        assert comp.compiled == 3
        assert comp.get(("regex", "a")) is a and comp.compiled == 3
        comp.get(("regex", "b"))
        assert comp.compiled == 4  # compiled again
    finally:
        comp.close()


def test_keys_name_the_constraint_and_the_vocabulary(table: TokenTable) -> None:
    comp = GrammarCompiler(table, backend="outlines")
    other = GrammarCompiler(TokenTable(bpe_tokenizer(TOKENS[:-1], MERGES[:-1]), VOCAB_SIZE, []),
                            backend="outlines")
    try:
        key = comp.key(("regex", "ab"))
        assert key == comp.key(("regex", "ab")) and len(key) == 32
        assert key != comp.key(("regex", "abc"))
        assert key != comp.key(("choices", ("ab",)))
        assert key != other.key(("regex", "ab"))
        assert comp.get(("regex", "ab")).key == key
    finally:
        comp.close()
        other.close()


@pytest.mark.parametrize(("constraint", "message"), [
    (("regex", "("), "regex '(' is invalid: missing ), unterminated subpattern"),
    (("regex", "a{2,1}"), "regex 'a{2,1}' is invalid: min repeat greater than max repeat"),
    (("regex", "(?=a)a"), "regex '(?=a)a' cannot be compiled"),  # Python's re takes it
    (("json_schema", "{"), "json_schema is invalid: Expecting property name"),
    (("json_schema", '{"type": "nope"}'), "json_schema is invalid: Unsupported type: nope"),
    (("grammar", "x"), "unknown constraint kind 'grammar'"),
])
def test_invalid_constraints_are_refused_before_compiling(
        table: TokenTable, constraint: Any, message: str) -> None:
    comp = GrammarCompiler(table, backend="outlines")
    try:
        with pytest.raises(ValueError, match=re.escape(message)):
            comp.compile_async(constraint)
        with pytest.raises(ValueError, match=re.escape(message)):  # not cached as anything
            comp.get(constraint)
        assert comp.compiled == 0
    finally:
        comp.close()


def test_a_regex_the_vocabulary_cannot_write_fails_in_its_future(table: TokenTable) -> None:
    comp = GrammarCompiler(table, backend="outlines")
    try:
        future = comp.compile_async(("regex", "az"))  # valid, but no token has a "z"
        with pytest.raises(ValueError, match="incompatible with the regex"):
            future.result()
        assert comp.compiled == 0
        retry = comp.compile_async(("regex", "az"))  # not cached: tried again
        assert retry is not future
        with pytest.raises(ValueError, match="incompatible"):
            retry.result()
    finally:
        comp.close()


def test_choices_are_escaped_literals(compiler: GrammarCompiler) -> None:
    assert escape_literal("a.b|c") == r"a\.b\|c"
    assert to_regex(("choices", ("a.b", "c|d", "x"))) == r"(a\.b|c\|d|x)"
    assert to_regex(("regex", "a.b")) == "a.b"
    assert re.fullmatch(to_regex(("choices", ("a+b", "(x)"))), "a+b")
    g = compiler.get(("choices", ("ab", "cd")))
    assert OutlinesState(g).forced() == ()
    assert walk(g, T("cd")).forced() == (EOS,)
    assert walk(g, T("ab")).forced() == (EOS,)
    assert g.index.get_next_state(OutlinesState(g).state, VOCAB["abc"]) is None


def test_every_choice_is_reachable_when_one_extends_another(compiler: GrammarCompiler) -> None:
    """outlines-core's automaton takes the first alternative that matches: choices compiled in
    the given order ('(ab|abcd)') refused 'cd' after 'ab' and forced EOS there."""
    g = compiler.get(("choices", ("ab", "abcd")))
    after_ab = walk(g, T("ab"))
    assert VOCAB["cd"] in allowed(g, after_ab.state)
    assert after_ab.forced() == ()  # the output may end or go on
