"""Small real tokenizers built in memory, for tests that need one but not the default model's."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def byte_level_bpe(corpus: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE trained on `corpus`, with "<eos>" as its only special token
    (text it never saw falls back to one token per byte)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(corpus), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
