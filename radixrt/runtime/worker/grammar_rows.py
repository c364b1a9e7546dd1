"""The worker's side of constrained decoding: each step's allowed-token masks for the rows a
grammar constrains (built together on the mask thread while the step's forward pass runs, then
applied by the sampler in one masked fill), and the grammar bookkeeping after a token is chosen
(advance; jump-forward appends the forced tokens).

Speculative decoding samples a request at several positions in one step: after its last token and
after each drafted token (a small tree of them: worker/draft_verifier.py). Each such row is a
`MaskRow` that lies `ahead` drafted tokens (its path in the tree) past its grammar state; the
state is walked along each row's path while the masks are built (back to where the paths part,
then on) and rolled back after, so it is where it was when sampling starts. A drafted token the
grammar forbids ends its branch: the rows under it are left unconstrained (the sampler cannot
pick the forbidden token at the row before it, so verification never reaches them)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from radixrt.runtime.constrained.grammar_engine import GrammarState, expand_bitmask, mask_words
from radixrt.runtime.messages import MaskTiming
from radixrt.runtime.worker.sampler import AllowedTokens


@dataclass(frozen=True)
class MaskRow:
    """A sampled row's grammar: `state`, then the drafted tokens `ahead` of it (speculative
    decoding; rows of one state come in draft order, each one's parent row before it)."""

    state: GrammarState
    ahead: tuple[int, ...] = ()


class MaskThread:
    """Builds a step's masks on a thread of its own, so they cost the step nothing where the
    forward pass takes longer (the pass runs on the accelerator, or in torch's own threads with
    the GIL released; the engines' mask code is native too). The grammar states a step's masks
    read are not touched by anyone else until `PendingMasks.result` returns. The thread starts
    with the first constrained step."""

    def __init__(self, vocab_size: int, threaded: bool = True) -> None:
        """threaded=False builds the masks at start(), on the step's thread: on the CPU the
        forward pass already keeps every core busy, and a mask thread beside it slowed JSON
        decoding 1.3x (benchmarks/json_decode.py, 2 cores)."""
        self.vocab_size = vocab_size
        self.threaded = threaded
        self._pool: ThreadPoolExecutor | None = None

    def start(self, grammars: Sequence[MaskRow | None]) -> PendingMasks | None:
        """Begin the masks of one step's sampled rows (None: no row has a grammar)."""
        if all(g is None or g.state.ended for g in grammars):
            return None
        if not self.threaded:
            done: Future[tuple[AllowedTokens | None, float]] = Future()
            done.set_result(_timed_masks(list(grammars), self.vocab_size))
            return PendingMasks(done)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixrt-masks")
        return PendingMasks(self._pool.submit(_timed_masks, list(grammars), self.vocab_size))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class PendingMasks:
    def __init__(self, future: Future[tuple[AllowedTokens | None, float]]) -> None:
        self._future = future

    def result(self, device: torch.device) -> tuple[AllowedTokens | None, MaskTiming]:
        """Wait for the masks (re-raising the thread's error); they are moved to `device` here,
        on the step's own thread."""
        start = time.perf_counter()
        allowed, seconds = self._future.result()
        waited = time.perf_counter() - start
        rows = 0 if allowed is None else len(allowed[0])
        timing = MaskTiming(rows=rows, seconds=seconds, wait_seconds=waited)
        if allowed is None:
            return None, timing
        return (allowed[0], allowed[1].to(device)), timing

    def wait(self) -> None:
        """Wait for the thread to be done with the grammar states, whatever it raised (the
        step has failed already: its own error is the one to report)."""
        self._future.exception()


def _timed_masks(grammars: list[MaskRow | None],
                 vocab_size: int) -> tuple[AllowedTokens | None, float]:
    start = time.perf_counter()
    allowed = allowed_tokens(grammars, vocab_size)
    return allowed, time.perf_counter() - start


def allowed_tokens(grammars: Sequence[MaskRow | None],
                   vocab_size: int) -> AllowedTokens | None:
    """Masks (on the CPU) for the rows with a grammar; unconstrained rows are not touched (None:
    no row is).

    Where the grammar forces a continuation, only its first token is allowed, so decoding token
    by token picks the same tokens jump-forward appends. A grammar that has ended constrains
    nothing: its row belongs to a step planned past the request's end (overlap), sampled in vain.
    Rows ahead of their state by drafted tokens: see the module docstring."""
    rows: list[int] = []
    built: list[torch.Tensor] = []  # [words] int32 per row in `rows`
    extra_rows: list[int] = []  # (index into rows, EOS id) pairs also allowed
    extra_ids: list[int] = []
    advanced: dict[int, tuple[GrammarState, tuple[int, ...]]] = {}  # id(state) -> its path
    built_for: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, bool]] = {}  # row masks
    try:
        for i, row in enumerate(grammars):
            if row is None:
                continue
            state, key = row.state, id(row.state)
            if row.ahead:
                # None: the row before it (its parent in the draft) was refused, or ended
                previous = built_for.get((key, row.ahead[:-1]))
                if previous is None or not _allows(previous, row.ahead[-1], state):
                    continue
                at = advanced.get(key, (state, ()))[1]
                advanced[key] = (state, _walk(state, at, row.ahead))
            if state.ended:
                continue
            words = torch.zeros(mask_words(vocab_size), dtype=torch.int32)  # [words]
            forced = state.forced()
            end = False
            if forced:
                words[forced[0] // 32] = _bit(forced[0] % 32)
            else:
                state.write_mask(words)
                end = state.accepts_end()
                if end:  # every EOS id may end it
                    eos = sorted(state.grammar.table.eos_token_ids)
                    extra_ids += eos
                    extra_rows += [len(rows)] * len(eos)
            built_for[(key, row.ahead)] = (words, end)
            rows.append(i)
            built.append(words)
    finally:
        for state, at in advanced.values():
            state.rollback(len(at))
    if not rows:
        return None
    mask = expand_bitmask(torch.stack(built), vocab_size)  # [n, vocab] bool
    if extra_rows:
        mask[torch.tensor(extra_rows), torch.tensor(extra_ids)] = True
    return rows, mask


def _walk(state: GrammarState, at: tuple[int, ...], to: tuple[int, ...]) -> tuple[int, ...]:
    """Move a state that is `at` drafted tokens past where it was to `to` instead (back to
    where the two paths part, then on): every token of `to` before its last was allowed where it
    stands (its row was built), and its last was just checked."""
    same = 0
    while same < min(len(at), len(to)) and at[same] == to[same]:
        same += 1
    if len(at) > same:
        state.rollback(len(at) - same)
    for token in to[same:]:
        state.advance(token)
    return to


def _allows(previous: tuple[torch.Tensor, bool], token: int, state: GrammarState) -> bool:
    """Whether the row before, of mask (words, may end), allows `token` (the next drafted)."""
    words, may_end = previous
    if token in state.grammar.table.eos_token_ids:
        return may_end
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


def _bit(position: int) -> int:
    value = 1 << position
    return value - (1 << 32) if value >= 1 << 31 else value  # as a signed int32


def after_sample(grammar: GrammarState | None, token_ids: list[int], prompt_len: int,
                 max_tokens: int, jump_forward: bool) -> list[int]:
    """Advance the grammar past the token just appended to token_ids; with jump_forward, append
    the tokens it forces next (up to max_tokens outputs) and return them. Past the grammar's end
    (a token sampled in vain by a step planned before the scheduler knew of the end) nothing
    moves."""
    if grammar is None or grammar.ended:
        return []
    grammar.advance(token_ids[-1])
    if not jump_forward or grammar.ended:
        return []
    room = max_tokens - (len(token_ids) - prompt_len)
    forced = list(grammar.forced()[: max(room, 0)])
    for token in forced:
        grammar.advance(token)
        token_ids.append(token)
    return forced
