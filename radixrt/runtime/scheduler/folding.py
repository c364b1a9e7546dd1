"""Folding a step's results back into the requests: sampled tokens replace their placeholders,
jump-forward tokens are appended, prompt logprobs gathered, finished requests ended, computed
prompt chunks put into the radix tree, and n > 1 parents forked into their children. A run that
verified drafts (speculative decoding) gets the accepted ones before its sampled token, and the
KV of the rejected ones is given back.

A run's result is skipped when its request is gone or was preempted by recompute after the run
was planned (its epoch moved on: in_flight.py): those tokens are computed again. Pure
bookkeeping: no tensors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from radixrt.runtime.config import PLACEHOLDER_TOKEN
from radixrt.runtime.messages import Run, RunResult, StepPlan, StepResult, TokenLogprob
from radixrt.runtime.scheduler.in_flight import InFlightLedger
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.request_table import RequestTable
from radixrt.runtime.scheduler.speculator import Speculator
from radixrt.runtime.scheduler.stats import SchedulerStats
from radixrt.runtime.trace_messages import PrefillChunk, add_chunk


class ResultFolder:
    def __init__(
        self,
        table: RequestTable,
        kv: KVManager,
        stats: SchedulerStats,
        context_length: int,
        eos_token_ids: Sequence[int],
        speculator: Speculator | None = None,
    ) -> None:
        self.table = table
        self.speculator = speculator
        self.kv = kv
        self.stats = stats
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos_token_ids)

    def fold(self, plan: StepPlan, result: StepResult,
             in_flight: InFlightLedger) -> list[Request]:
        """Fold the worker's results in. Returns the requests that got tokens or finished.
        `in_flight`: the steps planned and not folded in yet; this one's record is taken out."""
        table = self.table
        by_rid: dict[int, RunResult] = {r.rid: r for r in result.results}
        touched = table.take_finished_outside_step()
        step = in_flight.fold(plan.step_id)
        if result.masks is not None:
            self.stats.grammar_masks += result.masks.rows
            self.stats.grammar_mask_seconds += result.masks.seconds
            self.stats.grammar_mask_wait_seconds += result.masks.wait_seconds
        self.stats.tier_move_seconds += result.move_seconds
        self.stats.images_encoded += result.images_encoded
        self.stats.image_cache_hits += result.image_cache_hits
        self.stats.image_encode_seconds += result.image_encode_seconds
        for run in plan.runs:
            req = table.requests.get(run.rid)
            if req is None or step.is_stale(req):
                continue  # gone, or recomputed since: this run's results are stale
            res = by_rid.get(run.rid)
            reaches_end = run.start + run.num_new == req.num_tokens
            if req.phase is Phase.SWAPPED and run.prompt_logprob_from >= 0 and res is not None:
                req.prompt_logprobs.extend(res.prompt_logprobs)  # its KV was kept
            if req.phase is Phase.SWAPPED and reaches_end and req.max_tokens == 0:
                # prefill only, swapped out while its last chunk ran (overlap): it is done,
                # its KV in host memory (a pin asked for cannot hold it in the tree)
                if req.pin:
                    req.pin_error = "its prefix was swapped out as it finished: not pinned"
                self._end_prefill(req, res)
                touched.append(req)
                continue
            if req.phase is not Phase.RUNNING:
                continue
            self.stats.computed_tokens += run.num_new
            if req.trace is not None and run.start < len(req.prompt_ids):
                add_chunk(req.trace, PrefillChunk(
                    step.planned_at, time.time(),
                    min(run.num_new, len(req.prompt_ids) - run.start)))
            if run.prompt_logprob_from >= 0 and res is not None:
                req.prompt_logprobs.extend(res.prompt_logprobs)
                req.prompt_logprobs_done = reaches_end
            if run.fork_into:
                shared = self.kv.cache_prefix(req)
                touched += self._fork(req, run.fork_into, by_rid, in_flight)
                if shared:  # the children start on the parent's pages: dedupe them too
                    for rid in run.fork_into:
                        child = table.requests.get(rid)
                        if child is not None and child.phase is Phase.RUNNING:
                            table.mark_for_dedupe(rid, shared)
                continue
            if run.sample and req.rid not in step.presolved:  # else jump-forward put it there
                assert res is not None and res.token is not None, f"no token for {run.rid}"
                touched.append(req)
                if run.draft and self._append_accepted(req, run, res.accepted):
                    continue  # finished (and released)
                if self._append(req, res.token) or self._append_forced(req, res.forced, in_flight):
                    continue  # finished (and released)
            if reaches_end and req.max_tokens == 0:  # prefill only: its prompt is computed
                self._end_prefill(req, res)  # into the radix tree (and pinned, if asked)
                touched.append(req)
                continue
            if run.known_end - run.start > 1 or not run.sample:  # not a (drafted) decode
                # share the computed prompt from the next step on
                shared = self.kv.cache_prefix(req)
                if shared:
                    table.mark_for_dedupe(req.rid, shared)
        return touched

    def _end_prefill(self, req: Request, res: RunResult | None) -> None:
        """A prefill-only request's prompt is computed: it ends, with its pooled output."""
        if res is not None and res.pooled:
            req.pooled = res.pooled
            self.stats.pooled_requests += 1
        self.table.end(req, "length")

    def _append(self, req: Request, token: TokenLogprob) -> bool:
        """The sampled token replaces the oldest placeholder. True if the request finished."""
        assert req.pending > 0
        index = len(req.output_ids) - req.pending
        req.output_ids[index] = token.token_id
        req.pending -= 1
        req.output_logprobs.append(token)
        self.stats.generated_tokens += 1
        reason = self.finish_reason(req, token.token_id, req.num_known_outputs)
        if reason is None:
            return False
        del req.output_ids[index + 1 :]  # a step planned past the end samples in vain
        req.pending = 0
        self.table.end(req, reason)
        return True

    def _append_accepted(self, req: Request, run: Run, accepted: Sequence[TokenLogprob]) -> bool:
        """Speculative decoding: the drafts the worker accepted go before the placeholder of the
        token it sampled after them, and the rejected drafts' positions are given back. True if
        the request finished (at an accepted token)."""
        self.kv.truncate(req, run.known_end + len(accepted))
        if req.trace is not None:
            req.trace.drafted_tokens += len(run.draft)
            req.trace.accepted_tokens += len(accepted)
        if self.speculator is not None:
            taken = [t.token_id for t in accepted]
            chain = run.draft_chain
            self.speculator.verified(req, len(run.draft), chain, len(taken),
                                     taken != run.draft[: min(chain, len(taken))])
        for token in accepted:
            index = len(req.output_ids) - req.pending  # where the placeholder is
            req.output_ids.insert(index, token.token_id)
            req.output_logprobs.append(token)
            self.stats.generated_tokens += 1
            reason = self.finish_reason(req, token.token_id, index + 1)
            if reason is not None:
                del req.output_ids[index + 1 :]
                req.pending = 0
                self.table.end(req, reason)
                return True
        return False

    def _append_forced(self, req: Request, forced: Sequence[int],
                       in_flight: InFlightLedger) -> bool:
        """Jump-forward: tokens the grammar forces after the sampled one (logprob 0: certain
        under the grammar). A step in flight samples the first of them itself: its placeholder
        becomes that token now and the step's result for it is skipped. True if finished."""
        if not forced:
            return False
        if req.pending:  # overlap scheduling: at most the latest plan is in flight
            assert req.pending == 1 and req.output_ids[-1] == PLACEHOLDER_TOKEN
            req.output_ids.pop()
            req.pending = 0
            in_flight.presolve(req.rid)
        start = len(req.output_ids)
        for i, token in enumerate(forced):
            req.output_ids.append(token)
            req.output_logprobs.append(TokenLogprob(token_id=token, logprob=0.0))
            self.stats.generated_tokens += 1
            reason = self.finish_reason(req, token, start + i + 1)
            if reason is not None:
                self.table.end(req, reason)
                return True
        return False

    def _fork(self, parent: Request, child_rids: list[int], by_rid: dict,
              in_flight: InFlightLedger) -> list[Request]:
        """n > 1: the parent's prefilled prompt becomes n children sharing its KV, each with
        the token the worker sampled for it; the parent ends as "forked"."""
        table = self.table
        children = []
        for i, rid in enumerate(child_rids):
            child = Request(
                rid=rid,
                prompt_ids=parent.prompt_ids,
                params=parent.params,
                max_tokens=parent.max_tokens,
                arrival=parent.arrival,
                extra_key=parent.extra_key,
                lora=parent.lora,
                images=parent.images,
                priority=parent.priority,
                tenant=parent.tenant,
                seed_offset=i,
                parent_rid=parent.rid,
                phase=Phase.RUNNING,
                admitted_at=parent.admitted_at,
                outputs_at_start=parent.outputs_at_start,
                cached_len=parent.cached_len,
                prompt_logprobs_done=True,
                trace=None if parent.trace is None else msgspec.structs.replace(
                    parent.trace, chunks=list(parent.trace.chunks),
                    preemptions=parent.num_preemptions),
            )
            children.append(child)
        table.fork(parent, children)
        touched = [parent]
        for child in children:
            res = by_rid.get(child.rid)
            if res is not None and res.token is not None and child.phase is Phase.RUNNING:
                child.output_ids.append(PLACEHOLDER_TOKEN)
                child.pending = 1
                if not self._append(child, res.token):
                    self._append_forced(child, res.forced, in_flight)
            touched.append(child)
        if parent.abort_requested:  # aborted while its fork was in flight
            for child in children:
                touched += table.abort(child.rid)
        return touched

    def finish_reason(self, req: Request, token: int, num_out: int) -> str | None:
        """Why the request ends with `token` as its num_out-th output, or None."""
        p = req.params
        if num_out >= p.min_tokens:
            if token in p.stop_token_ids:
                return "stop"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop"
        if num_out >= req.max_tokens or len(req.prompt_ids) + num_out >= self.context_length:
            return "length"
        return None
