"""The token sequences of recent native requests by their id (SGLang's rid), so that
/concate_and_append_request can name them: a bounded LRU (entries, tokens, age), keyed by the
cache namespace and tenant a request ran in, so one tenant never reads another's sequence.

A request's sequence is its prompt's tokens and its output's (one sample; a request with n > 1
has no single sequence and is not kept). Tokens are stored as 32-bit arrays: the token budget
bounds the memory (MAX_REGISTERED_TOKENS x 4 bytes)."""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

MAX_REGISTERED_SEQUENCES = 4096
MAX_REGISTERED_TOKENS = 1 << 22  # 16 MiB of token ids
REGISTERED_TTL_S = 3600.0

Namespace = tuple[str, str | None]  # (tenant, cache_salt)


class SequenceRegistry:
    def __init__(self, max_sequences: int = MAX_REGISTERED_SEQUENCES,
                 max_tokens: int = MAX_REGISTERED_TOKENS, ttl_s: float = REGISTERED_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[tuple[Namespace, str], tuple[array, float]] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, namespace: Namespace, rid: str, token_ids: Sequence[int]) -> None:
        """Keep (replacing) rid's sequence; one longer than the whole budget is not kept."""
        key = (namespace, rid)
        self._drop(key)
        if len(token_ids) > self.max_tokens:
            return
        self._entries[key] = (array("i", token_ids), self.clock())
        self.tokens += len(token_ids)
        while len(self._entries) > self.max_sequences or self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def get(self, namespace: Namespace, rid: str) -> list[int] | None:
        """rid's sequence (and it becomes the most recent), or None: unknown, or expired."""
        key = (namespace, rid)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() - entry[1] > self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[0].tolist()

    def _drop(self, key: tuple[Namespace, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.tokens -= len(entry[0])

    def info(self) -> dict[str, int]:
        return {"registered_sequences": len(self._entries), "registered_tokens": self.tokens}
