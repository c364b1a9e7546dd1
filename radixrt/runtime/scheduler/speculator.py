"""Speculative decoding, the scheduler's half: which decoding requests draft, what, how much.

A decoding request drafts the tokens that followed its last tokens elsewhere: in the radix tree
(DraftIndex, within its namespace, on its last NGRAM tokens) or in its own prompt and outputs
(ContextIndex, on its last NGRAM tokens or fewer), whichever match is longer (its own context on
a tie). The planner puts the draft in the request's
run (`Run.draft`): one extend of 1 + len(draft) tokens, verified by the worker in the same forward
pass as everything else (worker/draft_verifier.py); the folder hands back how many were accepted
(`verified`) and gives the rejected positions' KV back. A prompt's last chunk drafts the same way
(planner._prompt_draft): its extend is the chunk, then the draft after the prompt's end.

When to draft:
- only a request with no token in flight (its last token is known), never past its max_tokens or
  the context length (the token sampled after the draft counts too), and only into free KV pages:
  a draft never evicts the cache nor preempts anyone;
- only in a step with at most `max_batch_size` decoding requests: in a bigger batch the forward
  pass is no longer bound by reading the weights and the extra positions cost real time;
- each request's draft length adapts to its acceptance: all accepted doubles the rows verified
  (the draft and the token before it: 1, 3, 7 ... drafts, up to num_draft_tokens), otherwise
  it becomes the accepted count plus one;
- a request whose draft was rejected whole, or whose lookup found nothing, backs off: it drafts
  nothing for the next 1, 2, 4 ... MAX_BACKOFF_STEPS steps (doubling while it keeps missing;
  any accepted token resets it). Free prose copies little, and its requests mostly decode as
  without speculation.

Drafting needs a request's last token known when its step is planned, so overlap scheduling
gives way: a plan in which a request will draft next step (its back-off is over) is folded in
before the next is planned (in_flight.SYNC_SPECULATE), as is a plan with drafts (where the next
run starts depends on how many the worker accepted). Steps in which no request drafts or is about
to overlap as before.
"""

from __future__ import annotations

import time

from radixrt.runtime.scheduler.draft_index import DraftIndex
from radixrt.runtime.scheduler.request import DraftState, Request
from radixrt.runtime.scheduler.stats import SchedulerStats

# A request whose drafts keep missing drafts again after at most this many steps.
MAX_BACKOFF_STEPS = 16


class Speculator:
    def __init__(self, index: DraftIndex, num_draft_tokens: int, max_batch_size: int,
                 stats: SchedulerStats) -> None:
        self.index = index
        self.num_draft_tokens = num_draft_tokens
        self.max_batch_size = max_batch_size
        self.stats = stats

    def drafts_in(self, num_decodes: int) -> bool:
        """Whether a step with this many decoding requests drafts at all."""
        return 0 < num_decodes <= self.max_batch_size

    def draft(self, req: Request, room: int) -> list[int]:
        """The tokens `req` drafts this step (called once per step it decodes in, or computes
        its prompt's last chunk in, a step that drafts): at most `room` (what its max_tokens, the
        context length and the free KV pages leave after the token it samples anyway)."""
        state = req.draft_state
        if state is None:
            state = req.draft_state = DraftState(self.num_draft_tokens)
        if state.skip > 0:
            state.skip -= 1
            return []
        if req.pending or room <= 0:
            return []
        k = min(state.length, room)
        start = time.perf_counter()
        tokens = req.all_ids
        own_match, own = state.context.lookup(tokens, k)
        tree_match, tree = self.index.lookup(req.extra_key, tokens, k)
        draft = own if own_match >= tree_match else tree
        stats = self.stats
        stats.draft_lookups += 1
        stats.draft_lookup_seconds += time.perf_counter() - start
        if not draft:
            self._back_off(state)
        return draft

    @staticmethod
    def drafts_next(req: Request) -> bool:
        """Whether `req` will try to draft in its next step (so this one must be folded in
        before that one is planned: its token must be known)."""
        return req.draft_state is None or req.draft_state.skip == 0

    def verified(self, req: Request, drafted: int, accepted: int) -> None:
        """The worker kept `accepted` of the `drafted` tokens: count them, adapt the length."""
        stats = self.stats
        stats.spec_verifications += 1
        stats.spec_drafted_tokens += drafted
        stats.spec_accepted_tokens += accepted
        stats.spec_accepted_lengths[accepted] = stats.spec_accepted_lengths.get(accepted, 0) + 1
        state = req.draft_state
        if state is not None:
            full = accepted == drafted
            state.length = (min(self.num_draft_tokens, 2 * state.length + 1) if full
                            else accepted + 1)
            if accepted:
                state.backoff = 0
            else:
                self._back_off(state)

    @staticmethod
    def _back_off(state: DraftState) -> None:
        state.backoff = min(max(1, 2 * state.backoff), MAX_BACKOFF_STEPS)
        state.skip = state.backoff
