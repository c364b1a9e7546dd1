"""Exceptions that cross layers: raised by the scheduler, re-raised by the tokenizer manager,
turned into HTTP statuses by the server."""

from __future__ import annotations


class QueueFull(Exception):
    """The waiting queue (in all, or the tenant's share of it) is at its cap: the request was
    refused before it was queued. Retry after `retry_after_s` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
