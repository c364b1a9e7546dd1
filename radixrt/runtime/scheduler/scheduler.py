"""The scheduler: continuous batching over the radix cache, as one small facade.

It owns policy and bookkeeping, never tensors: `schedule()` plans the next StepPlan for the worker
and `process_results()` folds the worker's StepResult back in. The parts, each its own concept:

- `RequestTable` (request_table.py): every request, its queue, every transition of its life;
- `Planner` (planner.py): decodes, prefill chunks, admissions, preemption (making room:
  `Preemptor`, preemption.py);
- `ResultFolder` (folding.py): sampled and forced tokens, forks, finished requests;
- `KVManager` (kv_manager.py) over the page pool and the radix cache; a `SchedulePolicy`.

`StepLoop` (loop.py) drives it for the Engine, the scheduler process and the simulation alike. The
loop owns what exists only because steps are in flight, the `InFlightLedger` (in_flight.py), and
hands it to `schedule()` and `process_results()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixrt.runtime.config import MAX_LORA_ADAPTERS, EngineConfig, parse_tenant_weights
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import (
    ImageInput,
    check_image_prompt,
    images_bytes,
    is_image_id,
)
from radixrt.runtime.messages import (
    TIER_NAMES,
    LoraModuleShapes,
    OutputDelta,
    Scheduling,
    StepPlan,
    StepResult,
    WorkerReady,
)
from radixrt.runtime.pooling_params import PoolingInfo, check_pooling
from radixrt.runtime.sampling_params import SamplingParams, check_token_ids
from radixrt.runtime.scheduler.draft_index import DraftIndex
from radixrt.runtime.scheduler.fair_share import FairShare
from radixrt.runtime.scheduler.folding import ResultFolder
from radixrt.runtime.scheduler.in_flight import InFlightLedger
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.lora_table import LoraTable
from radixrt.runtime.scheduler.planner import Planner
from radixrt.runtime.scheduler.policy import make_policy
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.request_table import RequestTable
from radixrt.runtime.scheduler.speculator import Speculator
from radixrt.runtime.scheduler.stats import SchedulerStats
from radixrt.runtime.trace_messages import RequestTrace
from radixrt.runtime.worker.capacity import Capacity, typical_request_tokens
from radixrt.runtime.worker.disk_format import scan

# A request refused because a queue is full is told to retry after this many seconds.
QUEUE_FULL_RETRY_AFTER_S = 1
# the processed images the requests hold (waiting or running) at once, in bytes: past it a
# request with images is told to retry (QueueFull)
MAX_HELD_IMAGE_BYTES = 2 << 30


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        num_pages: int,
        context_length: int,
        eos_token_ids: Sequence[int],
        kv_bytes_per_token: int = 0,
        vocab_size: int | None = None,
        tier_pages: tuple[int, int] = (0, 0),
        lora_shapes: LoraModuleShapes | None = None,
        lora_max_rank: int = 0,
        pooling: PoolingInfo | None = None,
        takes_images: bool = False,
        image_blocks: bool = False,
    ) -> None:
        """kv_bytes_per_token: what one token costs in the pool (0: unknown, no capacity);
        vocab_size: the model's (WorkerReady), against which every request's token ids are
        checked at add_request (None: the simulation's scheduler, which has no model);
        tier_pages: the host and disk KV tiers' pages (0: none). lora_shapes / lora_max_rank:
        the projections LoRA adapters may adapt and the slots' rank (None: no adapters; with
        them, config.lora_paths are loaded here). With a disk tier in
        config.disk_cache_dir, what it holds is restored into the tree (a warm restart).
        pooling: what pooling requests the model serves (None: the simulation, no checks).
        takes_images: whether prompts may carry images (a vision-language model);
        image_blocks: whether an image's run is computed in one chunk (Gemma 3)."""
        self.config = config
        self.takes_images = takes_images
        self.pooling = pooling
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.capacity = Capacity(kv_bytes_per_token, config.page_size, num_pages,
                                 context_length) if kv_bytes_per_token else None
        self.stats = SchedulerStats()
        self.speculator: Speculator | None = None
        drafts = None
        if config.speculative_algorithm == "radix":
            drafts = DraftIndex()
            self.speculator = Speculator(drafts, config.speculative_num_draft_tokens,
                                         config.speculative_max_batch_size, self.stats)
        self.kv = KVManager(num_pages, config.page_size, config.disable_radix_cache, drafts,
                            *tier_pages)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.restored_tokens = 0  # a warm restart's tokens, from the disk tier
        if self.kv.tiers is not None and tier_pages[1] and config.disk_cache_dir:
            self.restored_tokens = self.kv.tiers.restore(
                scan(config.disk_cache_dir, config.tp_size))
        self.policy = make_policy(config.schedule_policy)
        self.table = RequestTable(
            self.kv, int(config.max_pinned_fraction * self.kv.capacity_tokens),
            FairShare(parse_tenant_weights(config.tenant_weights), config.fair_share_quantum))
        self.lora = LoraTable(lora_shapes, lora_max_rank, config.max_loras_per_batch,
                              MAX_LORA_ADAPTERS)
        for name, path in config.lora_adapters().items():
            self.lora.load(name, path)
        self.planner = Planner(config, self.table, self.kv, self.policy, self.stats,
                               context_length, self.speculator, self.lora, image_blocks)
        self.folder = ResultFolder(self.table, self.kv, self.stats, context_length,
                                   eos_token_ids, self.speculator)

    @classmethod
    def for_worker(cls, config: EngineConfig, ready: WorkerReady) -> Scheduler:
        """The scheduler sized by what the worker reported at start-up."""
        return cls(config, ready.num_pages, ready.context_length, ready.eos_token_ids,
                   ready.kv_bytes_per_token, ready.vocab_size,
                   (ready.host_pages, ready.disk_pages), ready.lora_shapes, ready.lora_max_rank,
                   ready.pooling, ready.takes_images, ready.image_blocks)

    # --- the views the engine, the loop and the tests read ----------------------------------
    @property
    def requests(self) -> dict[int, Request]:
        return self.table.requests

    @property
    def waiting(self) -> list[Request]:
        return self.table.waiting

    @property
    def running(self) -> list[Request]:
        return self.table.running

    @property
    def swapped(self) -> list[Request]:
        return self.table.swapped

    @property
    def children(self) -> dict[int, list[int]]:
        return self.table.children

    @property
    def has_work(self) -> bool:
        return self.table.has_work

    # --- submission --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        scheduling: Scheduling | None = None,
        rid: int | None = None,
        pin: bool = False,
        grammar_ready: bool = True,
        images: Sequence[ImageInput] = (),
    ) -> Request:
        """Queue a request: every path (the Engine, the scheduler process) passes here once, so
        the checks that need the model (context length, vocabulary) are made here. `scheduling`:
        its priority, tenant, cache namespace and queue timeout (messages.Scheduling). With
        pin=True, a request that finishes normally keeps its prefix locked in the radix tree (so
        forks of a DSL program reuse it) until `unpin(rid)`. grammar_ready=False: its grammar is
        compiling; it waits (counted against the caps) until `grammar_ready(rid)`. images: the
        prompt's images, whose placeholder ids stand in prompt_ids (image_messages.py). Raises
        ValueError for a prompt that
        breaks the context limits or token ids outside the vocabulary, QueueFull when the
        waiting queue (or the tenant's part of it) is at its cap; a request that can never fit
        the KV pool finishes at once with an error reason."""
        scheduling = scheduling or Scheduling()
        prompt_ids = [int(t) for t in prompt_ids]
        max_tokens = self.check_limits(prompt_ids, params, images)
        self.check_queue(scheduling.tenant)
        self.check_images_held(images)
        lora, extra_key = None, scheduling.extra_key
        if scheduling.lora is not None:
            lora, extra_key = self.lora.resolve(scheduling.lora, scheduling.extra_key)
        req = Request(
            rid=self.table.new_rid() if rid is None else rid,
            prompt_ids=prompt_ids,
            params=params,
            max_tokens=max_tokens,
            arrival=self.table.next_arrival(),
            grammar_ready=grammar_ready,
            extra_key=extra_key,
            lora=lora,
            images=list(images),
            priority=scheduling.priority,
            tenant=scheduling.tenant,
            pin=pin,
            trace=RequestTrace() if scheduling.trace else None,
        )
        self.table.enqueue(req)
        if scheduling.timeout_s is not None:
            req.deadline_s = req.submitted_s + scheduling.timeout_s
        need = len(prompt_ids) + params.n * (max_tokens + self.kv.page_size)
        if need > self.kv.capacity_tokens:
            self.table.fail(
                req,
                f"the request needs up to {need} KV slots (prompt {len(prompt_ids)} + "
                f"n={params.n} x max_tokens={max_tokens}) but the KV pool holds "
                f"{self.kv.capacity_tokens}; lower max_tokens or n, or raise max_total_tokens",
            )
        return req

    def grammar_ready(self, rid: int) -> None:
        """The grammar of a request submitted with grammar_ready=False is compiled: it may be
        admitted now (a no-op for a request that already ended)."""
        req = self.table.requests.get(rid)
        if req is not None:
            req.grammar_ready = True

    def check_queue(self, tenant: str) -> None:
        """Raise QueueFull when the waiting queue, or `tenant`'s part of it, is at its cap."""
        cfg = self.config
        cap, tenant_cap = cfg.max_queued_requests, cfg.max_queued_per_tenant
        waiting = self.table.queued()
        if cap is not None and waiting >= cap:
            self.stats.queue_full += 1
            raise QueueFull(f"the server is at capacity: {cap} requests are waiting "
                            f"(--max-queued-requests); retry after {QUEUE_FULL_RETRY_AFTER_S}s",
                            QUEUE_FULL_RETRY_AFTER_S)
        mine = self.table.queued(tenant)
        if tenant_cap is not None and mine >= tenant_cap:
            self.stats.queue_full += 1
            who = f"tenant {tenant!r}" if tenant else "the shared tenant"
            raise QueueFull(f"{who} has {tenant_cap} requests waiting, its cap "
                            f"(--max-queued-per-tenant); retry after "
                            f"{QUEUE_FULL_RETRY_AFTER_S}s", QUEUE_FULL_RETRY_AFTER_S)

    def check_images_held(self, images: Sequence[ImageInput]) -> None:
        """Raise QueueFull when the requests' images (their tensors stay with them until they
        end) and these would pass MAX_HELD_IMAGE_BYTES."""
        if not images:
            return
        held = sum(images_bytes(r.images) for r in self.table.requests.values()
                   if r.images and r.parent_rid is None and not r.finished)
        if held + images_bytes(images) > MAX_HELD_IMAGE_BYTES:
            self.stats.queue_full += 1
            raise QueueFull(f"the server holds {held} bytes of images for its requests; these "
                            f"would pass {MAX_HELD_IMAGE_BYTES}: retry after "
                            f"{QUEUE_FULL_RETRY_AFTER_S}s", QUEUE_FULL_RETRY_AFTER_S)

    def check_limits(self, prompt_ids: Sequence[int], params: SamplingParams,
                     images: Sequence[ImageInput] = ()) -> int:
        """Raise ValueError for a prompt that breaks the context limits or names token ids the
        model does not have (an image's placeholders aside); returns the max_tokens it runs
        with (None: the default rule)."""
        if not prompt_ids:
            raise ValueError("prompt is empty: give at least one token")
        if images and not self.takes_images:
            raise ValueError("this model takes no images: serve a vision-language model")
        check_image_prompt(prompt_ids, images)
        if self.vocab_size is not None:
            check_token_ids([t for t in prompt_ids if not is_image_id(t)], self.vocab_size)
            params.validate_for_vocab(self.vocab_size)
        if self.pooling is not None:
            check_pooling(params.pooling, self.pooling, self.vocab_size)
        limit = self.context_length
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens but the context length is {limit}: "
                f"shorten it to at most {limit - 1} tokens"
            )
        max_tokens = params.resolved_max_tokens(len(prompt_ids), limit)
        if len(prompt_ids) + max_tokens > limit:
            raise ValueError(
                f"max_tokens={max_tokens} plus the prompt's {len(prompt_ids)} tokens "
                f"exceeds the context length {limit}: lower max_tokens to at most "
                f"{limit - len(prompt_ids)}"
            )
        return max_tokens

    def abort(self, rid: int) -> list[Request]:
        """Abort a request (and all its samples) at any stage; returns the requests ended."""
        return self.table.abort(rid)

    def finish(self, rid: int, reason: str) -> list[Request]:
        """End a request from outside (a stop string the detokenizer saw); returns it."""
        req = self.table.requests.get(rid)
        if req is None or req.finished:
            return []
        self.table.end(req, reason)
        return [req]

    def unpin(self, rid: int) -> bool:
        """Release the prefix a pinned request kept locked; False when nothing was pinned."""
        return self.table.unpin(rid)

    # --- stepping ----------------------------------------------------------------------------
    def schedule(self, in_flight: InFlightLedger) -> StepPlan | None:
        """The next step's plan (recorded in `in_flight`), or None when there is nothing to do."""
        return self.planner.schedule(in_flight)

    def process_results(self, plan: StepPlan, result: StepResult,
                        in_flight: InFlightLedger) -> list[Request]:
        """Fold the worker's results in. Returns the requests that got tokens or finished."""
        return self.folder.fold(plan, result, in_flight)

    def take_finished_outside_step(self) -> list[Request]:
        """Requests that ended with no step to report them (errors at admission)."""
        return self.table.take_finished_outside_step()

    def take_deltas(self, touched: Sequence[Request]) -> list[OutputDelta]:
        """The outputs the touched requests gained, as messages for the client side."""
        return self.table.take_deltas(touched)

    # --- introspection -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise RuntimeError on any KV leak, double free or miscount."""
        self.table.check_integrity()

    def flush_cache(self) -> int:
        """Drop every unlocked cached page; returns the tokens freed."""
        return self.kv.flush()

    def stats_dict(self) -> dict[str, Any]:
        """Pool counters and totals, as Engine.stats() and /server_info report them."""
        s = self.stats
        counters = self.kv.counters(self.table.running)
        return {
            "kv_total": counters.total,
            "kv_free": counters.free,
            "kv_evictable": counters.evictable,
            "kv_locked": counters.locked,
            "kv_private": counters.private,
            "page_size": self.kv.page_size,
            "capacity": self.capacity.info(typical_request_tokens(self.context_length))
            if self.capacity is not None else None,
            "running": len(self.table.running),
            "waiting": len(self.table.waiting),
            "swapped": len(self.table.swapped),
            "steps": s.steps,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "cache_hit_rate": s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
            "computed_tokens": s.computed_tokens,
            "generated_tokens": s.generated_tokens,
            "pooled_requests": s.pooled_requests,
            "preemptions": s.preemptions,
            "swaps": s.swaps,
            "swap_fallbacks": s.swap_fallbacks,
            "grammar_masks": s.grammar_masks,
            "grammar_mask_seconds": s.grammar_mask_seconds,
            "grammar_mask_wait_seconds": s.grammar_mask_wait_seconds,
            "images_encoded": s.images_encoded,
            "image_cache_hits": s.image_cache_hits,
            "image_encode_seconds": s.image_encode_seconds,
            "speculative_algorithm": self.config.speculative_algorithm,
            "draft_lookups": s.draft_lookups,
            "draft_lookup_seconds": s.draft_lookup_seconds,
            "spec_verifications": s.spec_verifications,
            "spec_drafted_tokens": s.spec_drafted_tokens,
            "spec_accepted_tokens": s.spec_accepted_tokens,
            "spec_accepted_lengths": dict(sorted(s.spec_accepted_lengths.items())),
            "spec_tree_verifications": s.spec_tree_verifications,
            "spec_branch_accepted_tokens": s.spec_branch_accepted_tokens,
            "draft_index_entries": (self.speculator.index.entries
                                    if self.speculator is not None else 0),
            "priority_preemptions": s.priority_preemptions,
            "preemptions_by_cause": dict(s.preemptions_by_cause),
            "running_by_tenant": self.table.running_by_tenant(),
            "tenant_weights": dict(self.table.fair.weights),
            "preemptions_caused_by_priority": dict(s.preemptions_caused_by_priority),
            "preemptions_caused_by_tenant": dict(s.preemptions_caused_by_tenant),
            "queue_timeouts": s.timeouts,
            "queue_full": s.queue_full,
            "max_queued_requests": self.config.max_queued_requests,
            "max_queued_per_tenant": self.config.max_queued_per_tenant,
            "pinned": len(self.table.pins),
            "pinned_tokens": self.kv.pinned_tokens(self.table.pins.values()),
            "pin_budget_tokens": self.table.pin_budget_tokens,
            "pins_refused": self.table.pins_refused,
            "disable_radix_cache": self.kv.disable_radix_cache,
            "kv_tiers": self._tiers_info(),
        }

    def _tiers_info(self) -> dict[str, Any] | None:
        """The KV tiers below the pool: each tier's size and use (tokens, bytes), tokens served
        from it, pages moved each way, seconds moving them; None without tiers."""
        tiers = self.kv.tiers
        if tiers is None:
            return None
        ps, per_token = self.kv.page_size, self.kv_bytes_per_token
        info: dict[str, Any] = {}
        for tier, name in enumerate(TIER_NAMES):
            pool = tiers.pools[tier]
            if pool is None:
                continue
            info[name] = {
                "tokens": pool.num_pages * ps, "bytes": pool.num_pages * ps * per_token,
                "cached_tokens": self.kv.tree.tier_pages(tier) * ps,
                "hit_tokens": tiers.stats.hit_tokens[tier],
            }
        info["moved_tokens"] = {f"{TIER_NAMES[a]}->{TIER_NAMES[b]}": n * ps
                                for (a, b), n in sorted(tiers.stats.moved_pages.items())}
        info["move_seconds"] = self.stats.tier_move_seconds
        info["prefetched_tokens"] = self.stats.prefetched_tokens
        info["restored_tokens"] = self.restored_tokens
        return info
