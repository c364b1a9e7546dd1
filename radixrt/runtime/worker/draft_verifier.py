"""Speculative decoding, the worker's half: verifying a run's drafted tokens (the scheduler's
half, drafting: scheduler/speculator.py).

A run with a draft d_1..d_k computes its last known token and the k drafts in one extend; the
logits after the last known token and after each d_i are all sampled, each row exactly as
decoding token by token would sample it there (the same processing, penalties over the outputs
before it, its grammar state advanced through the drafts before it, and a seeded row's noise
keyed by its output index). Call those samples x_0..x_k. Verification keeps d_1..d_a for the
largest a with x_i == d_{i+1} for every i < a, and emits x_0..x_a: the a accepted drafts (equal to
x_0..x_{a-1}) and x_a, the token sampled after them.

This is exact, not an approximation. Every emitted token is a sample of the model's (processed)
distribution at its position given the tokens before it, so greedy outputs are token-identical to
decoding without speculation and seeded outputs are identical too. For temperature > 0 it is the
standard rejection-sampling rule of speculative sampling with a draft distribution q that puts all
its mass on d (a lookup proposes one token): that rule accepts d with probability
min(1, p(d) / q(d)) = p(d) and otherwise samples from max(0, p - q) renormalised, which is p
without d; drawing x ~ p and accepting iff x == d realises exactly that.

Verification also ends at a sample that ends the output (an EOS or stop token id: nothing after
it counts, and a grammar takes no token after its end), and at one after which the grammar forces
tokens: jump-forward appends those after it, as it would without speculation (so their logprobs
are 0.0 either way).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence


def accepted_count(draft: Sequence[int], sampled: Sequence[int], stops: Collection[int],
                   goes_on: Callable[[int], bool] | None = None) -> int:
    """How many drafted tokens verification keeps. sampled[i] is the token drawn at the row after
    draft[:i] (len(sampled) == len(draft) + 1); stops: the token ids that end the output;
    goes_on(token), asked of each sample that matches its draft in order: True when decoding
    goes on by sampling after it (it is then kept), False when jump-forward takes over there."""
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"{len(sampled)} samples for a draft of {len(draft)} tokens")
    n = 0
    while n < len(draft) and sampled[n] == draft[n] and sampled[n] not in stops:
        if goes_on is not None and not goes_on(sampled[n]):
            break
        n += 1
    return n
