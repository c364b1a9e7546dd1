"""The worker's side of constrained decoding: each step's allowed-token masks for the rows a
grammar constrains (built together, then applied by the sampler in one masked fill), and the
grammar bookkeeping after a token is chosen (advance; jump-forward appends the forced tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixrt.runtime.constrained.grammar_engine import GrammarState, expand_bitmask, mask_words
from radixrt.runtime.worker.sampler import AllowedTokens


def allowed_tokens(grammars: Sequence[GrammarState | None], vocab_size: int,
                   device: torch.device) -> AllowedTokens | None:
    """Masks for the rows with a grammar; unconstrained rows are not touched (None: no row is).

    Where the grammar forces a continuation, only its first token is allowed, so decoding token
    by token picks the same tokens jump-forward appends. A grammar that has ended constrains
    nothing: its row belongs to a step planned past the request's end (overlap), sampled in vain."""
    rows = [i for i, g in enumerate(grammars) if g is not None and not g.ended]
    if not rows:
        return None
    words = torch.zeros(len(rows), mask_words(vocab_size), dtype=torch.int32)  # [n, words]
    extra_rows: list[int] = []
    extra_ids: list[int] = []
    for j, i in enumerate(rows):
        grammar = grammars[i]
        assert grammar is not None
        forced = grammar.forced()
        if forced:
            words[j, forced[0] // 32] = _bit(forced[0] % 32)
            continue
        grammar.write_mask(words[j])
        table = grammar.grammar.table
        if grammar.accepts_end():  # every EOS id may end it
            extra_ids += sorted(table.eos_token_ids)
            extra_rows += [j] * len(table.eos_token_ids)
    mask = expand_bitmask(words, vocab_size)  # [n, vocab] bool
    if extra_rows:
        mask[torch.tensor(extra_rows), torch.tensor(extra_ids)] = True
    return rows, mask.to(device)


def _bit(position: int) -> int:
    value = 1 << position
    return value - (1 << 32) if value >= 1 << 31 else value  # as a signed int32


def after_sample(grammar: GrammarState | None, token_ids: list[int], prompt_len: int,
                 max_tokens: int, jump_forward: bool) -> list[int]:
    """Advance the grammar past the token just appended to token_ids; with jump_forward, append
    the tokens it forces next (up to max_tokens outputs) and return them. Past the grammar's end
    (a token sampled in vain by a step planned before the scheduler knew of the end) nothing
    moves."""
    if grammar is None or grammar.ended:
        return []
    grammar.advance(token_ids[-1])
    if not jump_forward or grammar.ended:
        return []
    room = max_tokens - (len(token_ids) - prompt_len)
    forced = list(grammar.forced()[: max(room, 0)])
    for token in forced:
        grammar.advance(token)
        token_ids.append(token)
    return forced
