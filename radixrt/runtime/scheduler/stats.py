"""The scheduler's running totals, as Engine.stats() and /server_info report them."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixrt.runtime.config import MAX_METRIC_LABELS

OTHER_LABEL = "other"  # counts past MAX_METRIC_LABELS distinct keys
# Why a running request was preempted: KV ran out for another running request, a more urgent
# request was waiting, or a tenant under its fair share was waiting.
MEMORY, PRIORITY, FAIR_SHARE = "memory", "priority", "fair_share"
PREEMPTION_CAUSES = (MEMORY, PRIORITY, FAIR_SHARE)


def count_capped(counts: dict[str, int], key: str) -> None:
    """counts[key] += 1, with at most MAX_METRIC_LABELS distinct keys (the rest: "other")."""
    if key not in counts and len(counts) >= MAX_METRIC_LABELS:
        key = OTHER_LABEL
    counts[key] = counts.get(key, 0) + 1


@dataclass
class SchedulerStats:
    steps: int = 0  # plans made (also the id of the latest plan)
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of which served from the radix cache
    computed_tokens: int = 0  # tokens through the model (prefill + decode)
    generated_tokens: int = 0
    pooled_requests: int = 0  # pooling requests answered (embeddings, scores)
    lora_dropped_tokens: int = 0  # cached KV dropped with unloaded LoRA adapters
    preemptions: int = 0
    preemptions_by_cause: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(PREEMPTION_CAUSES, 0))
    swaps: int = 0
    swap_fallbacks: int = 0  # swap mode, host swap space full: preempted by recompute instead
    # preemptions made for a more urgent waiting request, by that request's priority / tenant
    priority_preemptions: int = 0
    preemptions_caused_by_priority: dict[str, int] = field(default_factory=dict)
    preemptions_caused_by_tenant: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0  # requests that waited past their timeout
    queue_full: int = 0  # requests refused because a queue was at its cap
    # grammar masks built by the worker (one per constrained row per step), the seconds they
    # took, and the seconds sampling waited for them after the forward pass
    grammar_masks: int = 0
    grammar_mask_seconds: float = 0.0
    grammar_mask_wait_seconds: float = 0.0
    # speculative decoding: draft lookups and their seconds; runs verified, tokens drafted and
    # accepted in them, and how many runs accepted each number of tokens
    draft_lookups: int = 0
    draft_lookup_seconds: float = 0.0
    spec_verifications: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_lengths: dict[int, int] = field(default_factory=dict)
    # draft trees: verified drafts with branches, and tokens accepted off their main line
    spec_tree_verifications: int = 0
    spec_branch_accepted_tokens: int = 0
    # KV tiers: seconds the worker spent moving pages between tiers (PageMoves); tokens of
    # waiting requests' prefixes brought from disk to host memory ahead of their admission
    tier_move_seconds: float = 0.0
    # vision-language models: images through the vision encoder, images its cache had, and the
    # encoder's seconds (the worker's StepResults)
    images_encoded: int = 0
    image_cache_hits: int = 0
    image_encode_seconds: float = 0.0
    prefetched_tokens: int = 0
