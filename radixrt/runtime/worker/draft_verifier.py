"""Speculative decoding, the worker's half: verifying a run's drafted tokens (the scheduler's
half, drafting: scheduler/speculator.py).

A draft is a small tree of tokens after the run's last known token (the root): node i holds
draft[i] and hangs under parents[i] (-1: the root; a parent always comes before its children). A
chain is the tree whose parents are -1, 0, 1, ...; `Run.draft_parents` empty means one. The run
computes its last known token and every node in one forward pass, and every row is sampled
exactly as decoding token by token would sample it there: after the node's path from the root
(the same processing, penalties over the outputs before it, its grammar state advanced through
the path, and a seeded row's noise keyed by its output index). Call the sample at the root x_r and
at node i x_i. Verification walks down from the root: while the sample at the current place is
the token of one of its children, that child is accepted and the walk goes on from it. It emits
the accepted nodes' tokens and the sample at the last place reached.

This is exact, not an approximation. Every emitted token is a sample of the model's (processed)
distribution at its position given the tokens before it, so greedy outputs are token-identical to
decoding without speculation and seeded outputs are identical too. For temperature > 0 and a
chain it is the standard rejection-sampling rule of speculative sampling with a draft
distribution q that puts all its mass on d (a lookup proposes one token): that rule accepts d with
probability min(1, p(d) / q(d)) = p(d) and otherwise samples from max(0, p - q) renormalised,
which is p without d; drawing x ~ p and accepting iff x == d realises exactly that. With several
children the sample is drawn once and picks at most one of them: the emitted token is x ~ p
whatever was drafted.

The walk also ends at a sample that ends the output (an EOS or stop token id: nothing after it
counts, and a grammar takes no token after its end), and at one after which the grammar forces
tokens: jump-forward appends those after it, as it would without speculation (so their logprobs
are 0.0 either way).

Layout in the forward pass. The nodes come in `segments`: runs of consecutive nodes each the
child of the one before. The first segment (the chain from the root's first child down) is part
of the run's own extend; every later segment is a batch entry of its own whose prefix is the
run's known tokens and the slots of its ancestors, so each node attends to exactly its path (the
tree's attention mask, written as slot tables: every layer stores the pass's K/V before any
attention reads it). Node i's K/V goes to the run's slot after its known tokens plus i; once the
walk has accepted nodes a_1..a_n (depths 1..n), `kept_slots` says which K/V to copy so the
accepted path sits at the first n of those slots, as a chain's would.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from radixrt.runtime.messages import Run


def chain(length: int) -> list[int]:
    """The parents of a chain of `length` nodes."""
    return list(range(-1, length - 1))


def check_tree(parents: Sequence[int], size: int) -> None:
    """A draft's parents: one per node, each before its node (or -1, the root)."""
    if len(parents) != size:
        raise ValueError(f"{len(parents)} parents for a draft of {size} tokens")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"draft node {i}: parent {p} does not come before it")


def run_parents(run: Run) -> list[int]:
    """The parents of a run's draft nodes, checked (a chain's when the run gives none)."""
    if not run.draft_parents:
        return chain(len(run.draft))
    check_tree(run.draft_parents, len(run.draft))
    return run.draft_parents


def batch_entries(run: Run, token_ids: list[int],
                  slots: list[int]) -> list[tuple[list[int], int, list[int]]]:
    """The forward pass's entries for a run, as (tokens, prefix length, slot table): its own
    extend (its known tokens, then the main line), then each further branch of its draft, whose
    prefix is the known tokens and its ancestors' slots. `slots`: the request's table with the
    run's new slots appended (node i at known_end + i)."""
    end = run.known_end
    parts = segments(run_parents(run))  # the first hangs under the last known token
    first = parts[0][1] if parts else []
    entries = [(token_ids[run.start : end] + [run.draft[i] for i in first], run.start, slots)]
    for above, nodes in parts[1:]:
        prefix = slots[:end] + [slots[end + a] for a in above]
        entries.append(([run.draft[i] for i in nodes], len(prefix),
                        prefix + [slots[end + i] for i in nodes]))
    return entries


def segments(parents: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The draft's segments in node order: (ancestors of its first node, root first; its
    nodes). The first segment's ancestors are empty (its first node is the root's child)."""
    out: list[tuple[list[int], list[int]]] = []
    for i, p in enumerate(parents):
        if out and p == i - 1:
            out[-1][1].append(i)
        else:
            out.append((path(parents, p), [i]))
    return out


def path(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (empty for the root, -1)."""
    nodes: list[int] = []
    while node >= 0:
        nodes.append(node)
        node = parents[node]
    return nodes[::-1]


def accepted_path(draft: Sequence[int], parents: Sequence[int], sampled: Sequence[int],
                  stops: Collection[int],
                  goes_on: Callable[[int], bool] | None = None) -> list[int]:
    """The nodes verification accepts, root's child first. sampled[0] is the token drawn at the
    root's row, sampled[i + 1] at node i's (len(sampled) == len(draft) + 1); stops: the token ids
    that end the output; goes_on(token), asked of each sample that matches a child in order: True
    when decoding goes on by sampling after it (it is then accepted), False when jump-forward
    takes over there."""
    check_tree(parents, len(draft))
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"{len(sampled)} samples for a draft of {len(draft)} tokens")
    children: dict[tuple[int, int], int] = {}
    for i, (token, p) in enumerate(zip(draft, parents, strict=True)):
        children.setdefault((p, token), i)  # a repeated child: the first is the one
    accepted: list[int] = []
    at = -1
    while True:
        x = sampled[at + 1]
        child = children.get((at, x))
        if child is None or x in stops or (goes_on is not None and not goes_on(x)):
            return accepted
        accepted.append(child)
        at = child


def accepted_count(draft: Sequence[int], sampled: Sequence[int], stops: Collection[int],
                   goes_on: Callable[[int], bool] | None = None) -> int:
    """How many drafted tokens of a chain verification keeps (accepted_path of a chain)."""
    return len(accepted_path(draft, chain(len(draft)), sampled, stops, goes_on))


def kept_slots(accepted: Sequence[int]) -> list[tuple[int, int]]:
    """(from, to) node offsets whose K/V moves so the accepted nodes sit at offsets 0..n-1:
    node accepted[d] to offset d where they differ. Every source is read before any target is
    written (a target may be another pair's source: copy them together)."""
    return [(node, d) for d, node in enumerate(accepted) if node != d]
