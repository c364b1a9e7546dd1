"""The bytes each token stands for, and the outlines-core Vocabulary built from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from outlines_core import Vocabulary

from radixrt.runtime.config import GRAMMAR_END_MARKER


def _byte_level_map() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(token: str, byte_level: dict[str, int] | None) -> bytes:
    if byte_level is not None:
        try:
            return bytes(byte_level[c] for c in token)
        except KeyError:
            return token.encode()
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):  # byte fallback
        return bytes([int(token[3:5], 16)])
    return token.replace("▁", " ").encode()  # SentencePiece's space marker


class TokenTable:
    """Per token id: its bytes (None for special tokens), its first byte; the single-byte token
    of each byte; the EOS ids; and the outlines-core Vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        byte_level = _byte_level_map() if "ByteLevel" in repr(decoder) else None
        self.vocab_size = vocab_size
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.eos_token_ids = frozenset({self.eos_token_id, *map(int, eos_token_ids)})
        special = set(getattr(tokenizer, "all_special_ids", [])) | set(self.eos_token_ids)
        self.token_bytes: list[bytes | None] = [None] * vocab_size
        by_bytes: dict[bytes, list[int]] = {}
        for token, token_id in tokenizer.get_vocab().items():
            if token_id in special or token_id >= vocab_size:
                continue
            data = _token_bytes(token, byte_level)
            if not data:
                continue
            self.token_bytes[token_id] = data
            by_bytes.setdefault(data, []).append(token_id)
        self.first_byte = np.full(vocab_size, -1, dtype=np.int16)  # -1: special / none
        self.byte_token = [-1] * 256  # the token that is exactly this one byte
        for token_id, data in enumerate(self.token_bytes):
            if data is not None:
                self.first_byte[token_id] = data[0]
                if len(data) == 1:
                    self.byte_token[data[0]] = token_id
        self.vocabulary = Vocabulary(self.eos_token_id, by_bytes)
        marker = bytes([GRAMMAR_END_MARKER])  # never allowed under a grammar (grammar.py)
        self.marker_tokens = np.array([t for t, data in enumerate(self.token_bytes)
                                       if data and marker in data], dtype=np.int64)
        self.tokenizer = tokenizer
        self.identity = f"{getattr(tokenizer, 'name_or_path', '')}:{len(by_bytes)}:{vocab_size}"

    def encode(self, text: str) -> list[int]:
        """The tokenizer's own split of text (no special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))
