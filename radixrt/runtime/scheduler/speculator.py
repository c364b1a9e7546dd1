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
- each request's main line adapts to its acceptance: all accepted doubles the rows verified
  (the draft and the token before it: 1, 3, 7 ... drafts, up to num_draft_tokens), otherwise
  it becomes the accepted count plus one; the rest of num_draft_tokens goes to branches where
  other continuations are known (a draft tree: the verifier follows whichever the samples take,
  worker/draft_verifier.py), so a main line cut short by a miss still verifies as many rows;
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
from dataclasses import dataclass, field

from radixrt.runtime.image_messages import is_image_id
from radixrt.runtime.scheduler.draft_index import DraftIndex
from radixrt.runtime.scheduler.request import DraftState, Request
from radixrt.runtime.scheduler.stats import SchedulerStats

# A request whose drafts keep missing drafts again after at most this many steps.
MAX_BACKOFF_STEPS = 16
# A draft tree follows at most this many continuations (the main line and its branches): on the
# CPU every further branch is one more attention call per layer, and a second branch lost more
# than it caught (trees against chains, few-shot / code: 1.07x / 0.91x with 4, 1.11x / 1.02x
# with 2; docs/benchmarks.md#speculative-decoding).
MAX_DRAFT_PATHS = 2


@dataclass
class Draft:
    """What a request drafts in a step: tokens, each under its parent (-1: the token before the
    draft; a parent comes first), as `Run.draft` / `Run.draft_parents` carry them (parents empty:
    a chain)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, size: int) -> None:
        """Keep the first `size` nodes (still a tree: parents come first)."""
        del self.tokens[size:]
        del self.parents[size:]

    @classmethod
    def grow(cls, paths: list[list[int]], chain: int, size: int) -> Draft:
        """A tree of at most `size` nodes: the first path's first `chain` tokens; then each
        other path's first token where it leaves the tree so far; then the rest of each other
        path in turn, while nodes are left."""
        main = paths[0][:chain] if paths else []
        tokens, parents = list(main), list(range(-1, len(main) - 1))
        child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens, strict=True))}

        def add(path: list[int], at: int, start: int, new: int) -> int:
            """Walk `path` from its token `start` under node `at`, adding at most `new` nodes;
            where the walk stopped (a node, -2 at the path's end)."""
            for token in path[start:]:
                node = child.get((at, token))
                if node is None:
                    if new <= 0 or len(tokens) >= size:
                        return at
                    new -= 1
                    node = child[(at, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(at)
                at = node
            return -2

        parted = [add(path, -1, 0, 1) for path in paths[1:]]  # each keeps where it parts
        for path, at in zip(paths[1:], parted, strict=True):
            if at != -2:
                add(path, -1, 0, size)
        if parents == list(range(-1, len(tokens) - 1)):
            parents = []  # a chain
        return cls(tokens, parents)


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

    def draft(self, req: Request, room: int) -> Draft:
        """What `req` drafts this step (called once per step it decodes in, or computes its
        prompt's last chunk in, a step that drafts): at most `room` tokens (what its max_tokens,
        the context length and the free KV pages leave after the token it samples anyway).

        The main line is the continuation with the longer match (its own context on a tie), as
        long as its acceptance has earned (DraftState.length), leaving a node to each other
        continuation found unless the last main line was accepted whole; the nodes left go to
        those as branches (in order of their matches' lengths), each from where it leaves the
        tree so far, up to num_draft_tokens nodes and twice the main line's rows."""
        state = req.draft_state
        if state is None:
            state = req.draft_state = DraftState(self.num_draft_tokens)
        if state.skip > 0:
            state.skip -= 1
            return Draft()
        if req.pending or room <= 0:
            return Draft()
        size = min(self.num_draft_tokens, room)
        start = time.perf_counter()
        tokens = req.all_ids
        own = state.context.lookup(tokens, size)
        found = self.index.lookup_paths(req.extra_key, tokens, size, MAX_DRAFT_PATHS)
        if own[1]:  # the longer match first, its own on a tie (a stable sort)
            found.insert(0, own)
        found.sort(key=lambda f: f[0], reverse=True)
        paths = [path for _, path in found[:MAX_DRAFT_PATHS]]
        if any(is_image_id(t) for path in paths for t in path):
            # a draft never holds an image's placeholder: only its image's features could follow
            paths = [p for p in (_before_images(path) for path in paths) if p]
        # unless its last main line was accepted whole, the main line leaves each other
        # continuation known at least the token where it parts from it; a tree verifies at most
        # the rows the main line would have verified had it been accepted whole (rows doubled)
        chain = min(state.length, size if state.whole else size - len(paths) + 1)
        draft = Draft.grow(paths, chain, min(size, 2 * chain + 1))
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

    def verified(self, req: Request, drafted: int, chain: int, accepted: int,
                 branch: bool = False) -> None:
        """The worker kept `accepted` of the `drafted` tokens (a tree whose main line is `chain`
        long; `branch`: off the main line): count them, adapt the main line's length."""
        stats = self.stats
        stats.spec_verifications += 1
        stats.spec_tree_verifications += chain < drafted
        stats.spec_branch_accepted_tokens += accepted if branch else 0
        stats.spec_drafted_tokens += drafted
        stats.spec_accepted_tokens += accepted
        stats.spec_accepted_lengths[accepted] = stats.spec_accepted_lengths.get(accepted, 0) + 1
        state = req.draft_state
        if state is not None:
            full = state.whole = accepted >= chain
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


def _before_images(path: list[int]) -> list[int]:
    """The path up to its first image placeholder (image_messages.py)."""
    for i, token in enumerate(path):
        if is_image_id(token):
            return path[:i]
    return path
