"""The scheduler's running totals, as Engine.stats() and /server_info report them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    steps: int = 0  # plans made (also the id of the latest plan)
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of which served from the radix cache
    computed_tokens: int = 0  # tokens through the model (prefill + decode)
    generated_tokens: int = 0
    preemptions: int = 0
    swaps: int = 0
    swap_fallbacks: int = 0  # swap mode, host swap space full: preempted by recompute instead
