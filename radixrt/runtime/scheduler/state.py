"""The scheduler's bookkeeping: its queues, its requests, submission, aborts and the KV
invariant check. Planning and result folding build on it in scheduler.py."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.policy import make_policy
from radixrt.runtime.scheduler.request import Phase, Request


@dataclass
class SchedulerStats:
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of which served from the radix cache
    computed_tokens: int = 0  # tokens through the model (prefill + decode)
    generated_tokens: int = 0
    preemptions: int = 0
    swaps: int = 0


class SchedulerState:
    def __init__(
        self,
        config: EngineConfig,
        num_pages: int,
        context_length: int,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.config = config
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv = KVManager(num_pages, config.page_size, config.disable_radix_cache)
        self.policy = make_policy(config.schedule_policy)
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admission order
        self.swapped: list[Request] = []
        self.children: dict[int, list[int]] = {}  # n > 1 parent rid -> child rids
        self.stats = SchedulerStats()
        self.swap_used = 0  # host slots holding swapped-out KV
        self._rids = itertools.count()
        self._child_rids = itertools.count(-1, -1)  # n > 1 samples: never clash with clients'
        self._arrivals = itertools.count()
        self._admissions = itertools.count()
        self._pending_free: list[int] = []
        self._dedupe: dict[int, int] = {}  # rid -> pages that may duplicate the tree's
        self._finished_outside_step: list[Request] = []
        self.pins: dict[int, Any] = {}  # rid -> radix node its finished prefix keeps locked
        self._run_epochs: dict[int, dict[int, int]] = {}  # step id -> epoch of each run's rid
        # set when a preemption had to wait for the step in flight (overlap scheduling): the
        # caller folds that step's result in before planning again
        self.needs_sync = False

    # --- submission ------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        extra_key: str | None = None,
        rid: int | None = None,
        pin: bool = False,
    ) -> Request:
        """Queue a request. With pin=True, a request that finishes normally keeps its prefix
        locked in the radix tree (so forks of a DSL program reuse it) until `unpin(rid)`.
        Raises ValueError for a prompt that breaks the context limits; a
        request that can never fit the KV pool finishes at once with an error reason."""
        prompt_ids = [int(t) for t in prompt_ids]
        self.check_limits(prompt_ids, params)
        if rid is not None and (rid < 0 or rid in self.requests):
            raise ValueError(f"request id {rid} is negative or already in use")
        req = Request(
            rid=next(self._rids) if rid is None else rid,
            prompt_ids=prompt_ids,
            params=params,
            arrival=next(self._arrivals),
            extra_key=extra_key,
            pin=pin,
        )
        self.requests[req.rid] = req
        need = len(prompt_ids) + params.n * (params.max_tokens + self.kv.page_size)
        if need > self.kv.capacity_tokens:
            self._finish(
                req,
                f"error: the request needs up to {need} KV slots (prompt {len(prompt_ids)} + "
                f"n={params.n} x max_tokens={params.max_tokens}) but the KV pool holds "
                f"{self.kv.capacity_tokens}; lower max_tokens or n, or raise max_total_tokens",
            )
            self._finished_outside_step.append(req)
            return req
        self.waiting.append(req)
        return req

    def new_rid(self) -> int:
        """A request id for a request that will be added later (with add_request(rid=...))."""
        return next(self._rids)

    def check_limits(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError for a prompt that breaks the context limits."""
        if not prompt_ids:
            raise ValueError("prompt is empty: give at least one token")
        limit = self.context_length
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens but the context length is {limit}: "
                f"shorten the prompt to at most {limit - 1} tokens"
            )
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(
                f"max_tokens={params.max_tokens} plus the prompt's {len(prompt_ids)} tokens "
                f"exceeds the context length {limit}: lower max_tokens to at most "
                f"{limit - len(prompt_ids)}"
            )

    def abort(self, rid: int) -> list[Request]:
        """Abort a request at any stage (waiting, mid-prefill, decoding, swapped)."""
        req = self.requests.get(rid)
        if req is None:
            return []
        if req.forking and not req.finished:  # its children exist once the fork is folded in
            req.abort_requested = True
            return []
        aborted = []
        for child in self.children.get(rid, []):
            aborted += self.abort(child)
        if not req.finished:
            self.finish(rid, "abort")
            aborted.append(req)
        return aborted

    def finish(self, rid: int, reason: str) -> None:
        """End a request from outside (an abort, a stop string seen by the detokenizer)."""
        req = self.requests.get(rid)
        if req is None or req.finished:
            return
        if req.phase is Phase.WAITING:
            self.waiting.remove(req)
        elif req.phase is Phase.SWAPPED:
            self.swapped.remove(req)
            self.swap_used -= req.kv_len_swapped
            self._pending_free.append(rid)
        elif req.phase is Phase.RUNNING:
            self.running.remove(req)
            if req.pin and reason != "abort":
                self._pin(req)
            self.kv.release(req)
            self._pending_free.append(rid)
        self._finish(req, reason)

    def _pin(self, req: Request) -> None:
        node = self.kv.pin(req)
        if node is not None:
            self.pins[req.rid] = node

    def unpin(self, rid: int) -> bool:
        """Release the prefix a pinned request kept locked; False when nothing was pinned."""
        node = self.pins.pop(rid, None)
        if node is None:
            return False
        self.kv.unpin(node)
        return True

    def forget(self, rid: int) -> None:
        """Drop a finished request's record (the engine calls this once it has the output)."""
        req = self.requests.get(rid)
        if req is not None and req.finished:
            del self.requests[rid]
            self.children.pop(rid, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self._pending_free)

    def take_finished_outside_step(self) -> list[Request]:
        out, self._finished_outside_step = self._finished_outside_step, []
        return out

    def _finish(self, req: Request, reason: str) -> None:
        req.phase = Phase.FINISHED
        req.finish_reason = reason

    def stats_dict(self) -> dict[str, Any]:
        """Pool counters and totals, as Engine.stats() and /server_info report them."""
        s = self.stats
        counters = self.kv.counters(self.running)
        return {
            "kv_total": counters.total,
            "kv_free": counters.free,
            "kv_evictable": counters.evictable,
            "kv_locked": counters.locked,
            "kv_private": counters.private,
            "page_size": self.kv.page_size,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "swapped": len(self.swapped),
            "steps": s.steps,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "cache_hit_rate": s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
            "computed_tokens": s.computed_tokens,
            "generated_tokens": s.generated_tokens,
            "preemptions": s.preemptions,
            "swaps": s.swaps,
            "pinned": len(self.pins),
            "disable_radix_cache": self.kv.disable_radix_cache,
        }

    # --- accounting ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        for req in self.waiting + self.swapped:
            if req.pages or req.tree_node is not None:
                raise RuntimeError(f"request {req.rid} holds KV while {req.phase.value}")
        self.kv.check_integrity(self.running)
        swapped = sum(r.kv_len_swapped for r in self.swapped)
        if swapped != self.swap_used:
            raise RuntimeError(f"swap accounting: {swapped} swapped != {self.swap_used} used")
