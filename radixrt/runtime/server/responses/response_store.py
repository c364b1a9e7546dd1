"""Stored responses of POST /v1/responses (store=true), for GET /v1/responses/{id} and for the
next turn's previous_response_id.

Each entry keeps the response object and its conversation (the chat messages up to and
including its output, without the instructions, which OpenAI does not carry over), and the pin
of that conversation's KV in the radix tree: a lease the server holds for RESPONSE_PIN_TTL_S
(pin_leases.PinService.hold; bounded by the pin budget like every pin), so the next turn is a
cache hit by construction. A turn that continues a response takes over its pin: the new
conversation's pin covers the old one's tokens, so the old lease is released.

Bounded: at most `max_items` responses and `max_bytes` of their JSON; the least recently used
goes first (and its pin with it); an entry older than `ttl_s` is gone. At most `max_pins` of
them keep a pin (past that, the least recently used one's pin is released, the response kept),
so that stored conversations, which OpenAI's clients make by default, hold only part of the pin
budget. Entries are keyed by the API key's tenant: one tenant never sees another's responses (a
404, as for an unknown id).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.server.openai.openai_protocol import ChatMessage
from radixrt.runtime.tokenizer.pin_leases import PinService

MAX_STORED_RESPONSES = 1024
MAX_STORED_BYTES = 64 << 20  # of the stored responses' JSON (objects and conversations)
STORED_RESPONSE_TTL_S = 3600.0
RESPONSE_PIN_TTL_S = 600.0  # a stored conversation's KV stays pinned this long
MAX_STORED_PINS = 64  # stored conversations pinned at once


@dataclass
class StoredResponse:
    tenant: str
    response: dict[str, Any]
    conversation: list[ChatMessage]  # up to and with the output (kept as the chat path made it)
    pin_id: int | None
    size: int  # bytes of JSON, counted against max_bytes
    stored_at: float


class ResponseStore:
    def __init__(self, pins: PinService | None, max_items: int = MAX_STORED_RESPONSES,
                 max_bytes: int = MAX_STORED_BYTES, ttl_s: float = STORED_RESPONSE_TTL_S,
                 pin_ttl_s: float = RESPONSE_PIN_TTL_S, max_pins: int = MAX_STORED_PINS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pins = pins
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.pin_ttl_s = pin_ttl_s
        self.max_pins = max_pins
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self.bytes = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def info(self) -> dict[str, int]:
        return {"stored_responses": len(self._entries), "stored_response_bytes": self.bytes,
                "stored_responses_evicted": self.evicted_total}

    def get(self, tenant: str, rid: str) -> StoredResponse | None:
        """The tenant's stored response `rid` (now the most recently used), or None."""
        entry = self._entries.get((tenant, rid))
        if entry is None:
            return None
        if self._clock() - entry.stored_at > self.ttl_s:
            self._drop((tenant, rid))  # its pin's lease ran out long before
            return None
        self._entries.move_to_end((tenant, rid))
        return entry

    async def put(self, tenant: str, rid: str, response: dict[str, Any],
                  conversation: list[ChatMessage], pin_id: int | None) -> StoredResponse | None:
        """Store it (evicting the least recently used past the bounds); None when it alone is
        larger than max_bytes (then not stored, and its pin released)."""
        size = len(json.dumps(response)) + sum(len(m.model_dump_json()) for m in conversation)
        if pin_id is not None and self.pins is not None and \
                not self.pins.hold(pin_id, self.pin_ttl_s):
            pin_id = None  # its lease ran out already
        if size > self.max_bytes:
            await self._release(pin_id)
            return None
        await self.delete(tenant, rid)  # stored again: the new one replaces it
        entry = StoredResponse(tenant, response, conversation, pin_id, size, self._clock())
        self._entries[(tenant, rid)] = entry
        self.bytes += size
        while len(self._entries) > self.max_items or self.bytes > self.max_bytes:
            key = next(iter(self._entries))
            await self._release(self._drop(key).pin_id)
            self.evicted_total += 1
        pinned = [e for e in self._entries.values() if e.pin_id is not None]
        for oldest in pinned[:max(0, len(pinned) - self.max_pins)]:
            pin_id, oldest.pin_id = oldest.pin_id, None
            await self._release(pin_id)
        return entry

    async def take_pin(self, tenant: str, rid: str) -> None:
        """The turn after `rid` pinned its own conversation, which holds this one's tokens:
        release `rid`'s pin (the response itself stays stored)."""
        entry = self._entries.get((tenant, rid))
        if entry is not None and entry.pin_id is not None:
            pin_id, entry.pin_id = entry.pin_id, None
            await self._release(pin_id)

    async def delete(self, tenant: str, rid: str) -> bool:
        if (tenant, rid) not in self._entries:
            return False
        await self._release(self._drop((tenant, rid)).pin_id)
        return True

    def _drop(self, key: tuple[str, str]) -> StoredResponse:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        return entry

    async def _release(self, pin_id: int | None) -> None:
        if pin_id is not None and self.pins is not None:
            await self.pins.release(pin_id)  # False: its lease ran out already
