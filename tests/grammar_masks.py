"""Reading a grammar state's mask as a list of token ids (the constrained-decoding tests)."""

from __future__ import annotations

import torch

from radixrt.runtime.constrained.grammar_engine import GrammarState, expand_bitmask, mask_words


def allowed(state: GrammarState) -> list[int]:
    """The token ids the state's mask allows."""
    vocab = state.grammar.table.vocab_size
    words = torch.zeros(mask_words(vocab), dtype=torch.int32)
    state.write_mask(words)
    return expand_bitmask(words[None], vocab)[0].nonzero().flatten().tolist()
