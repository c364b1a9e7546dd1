"""Which replica a program goes to: the SGLang router's cache_aware rule, for DSL programs.

The rule, as the router applies it to each request (defaults: the REPLICA_* constants below, the
router's own):

1. Imbalanced? The loads (calls in flight from this client, per replica) are imbalanced when
   ``max - min > balance_abs_threshold`` *and* ``max > min * balance_rel_threshold``. Then the
   least loaded replica, whatever is cached where.
2. Otherwise, the best cache match: each replica's approximate prefix tree (prefix_tree.py)
   matches the text; if the best match is more than ``cache_threshold`` of the text, the replica
   with that match.
3. Otherwise, the replica with the smallest tree: the one this client has sent the least text to,
   so the most room for a new prefix.

Ties go to the less loaded replica, then the lower index. Whatever the rule picked, the text is
inserted into the chosen replica's tree (the replica will have computed it), and the tree is
trimmed to ``max_tree_chars``. A replica marked down (it exited or stopped answering) takes no
part: the rule runs over the others (the router likewise skips unhealthy workers).

`decide` is the rule alone, a pure function of the numbers; `ReplicaChooser` keeps the trees and
the loads, behind one lock, for the endpoint's threads. The chooser sees only this client's
traffic: other clients of the same replicas are invisible to it, as they are to one router
among several.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from radixrt.frontend.backends.prefix_tree import PrefixTree

# The DSL over several replicas (`rx.RuntimeEndpoint([address, ...])`) places each program the
# way the SGLang router's cache_aware policy places a request, with its defaults (sglang_router
# RouterArgs): balanced loads, the replica whose approximate prefix tree holds more than
# REPLICA_CACHE_THRESHOLD of the text, else the one with the smallest tree; imbalanced (in-flight
# calls max - min > REPLICA_BALANCE_ABS_THRESHOLD and max > min * REPLICA_BALANCE_REL_THRESHOLD),
# the least loaded. Each replica's tree keeps at most REPLICA_TREE_MAX_CHARS characters (least
# recently used leaves go first).
REPLICA_CACHE_THRESHOLD = 0.3
REPLICA_BALANCE_ABS_THRESHOLD = 64
REPLICA_BALANCE_REL_THRESHOLD = 1.5
REPLICA_TREE_MAX_CHARS = 2**26

BALANCE, CACHE, CAPACITY = "balance", "cache", "capacity"  # Choice.reason: which step chose


class NoReplicaUp(RuntimeError):
    """Every replica is marked down: there is nowhere to place a program."""


@dataclass(frozen=True)
class ChoiceRule:
    cache_threshold: float = REPLICA_CACHE_THRESHOLD
    balance_abs_threshold: int = REPLICA_BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = REPLICA_BALANCE_REL_THRESHOLD
    max_tree_chars: int = REPLICA_TREE_MAX_CHARS

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold={self.cache_threshold}: use 0.0..1.0")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold={self.balance_abs_threshold}: use >= 0")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold={self.balance_rel_threshold}: use >= 1.0")
        if self.max_tree_chars < 0:
            raise ValueError(f"max_tree_chars={self.max_tree_chars}: use >= 0")

    def imbalanced(self, loads: Sequence[int]) -> bool:
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold


@dataclass(frozen=True)
class Choice:
    replica: int
    reason: str  # BALANCE, CACHE or CAPACITY
    match_ratio: float  # the chosen replica's match / the text's length (0.0 for no text)


def decide(rule: ChoiceRule, text_len: int, matched: Sequence[int], loads: Sequence[int],
           tree_chars: Sequence[int], up: Sequence[bool] | None = None) -> Choice:
    """The rule on plain numbers: per replica, the characters of the text its tree matches,
    its calls in flight, its tree's size and whether it is up (default: all are)."""
    if not (len(matched) == len(loads) == len(tree_chars) > 0):
        raise ValueError("one matched length, load and tree size per replica (at least one)")
    live = [i for i in range(len(loads)) if up is None or up[i]]
    if not live:
        raise NoReplicaUp("every replica is down")

    def ratio(i: int) -> float:
        return matched[i] / text_len if text_len else 0.0

    def least(key: Sequence[int], among: Sequence[int]) -> int:
        return min(among, key=lambda i: (key[i], loads[i], i))

    if rule.imbalanced([loads[i] for i in live]):
        best = least(loads, live)
        return Choice(best, BALANCE, ratio(best))
    longest = max(matched[i] for i in live)
    if text_len and longest / text_len > rule.cache_threshold:
        best = least(loads, [i for i in live if matched[i] == longest])
        return Choice(best, CACHE, ratio(best))
    best = least(tree_chars, live)
    return Choice(best, CAPACITY, ratio(best))


class ReplicaChooser:
    """The trees and loads of N replicas, and `decide` over them. Thread-safe."""

    def __init__(self, num_replicas: int, rule: ChoiceRule | None = None) -> None:
        if num_replicas < 1:
            raise ValueError("a ReplicaChooser needs at least one replica")
        self.rule = rule or ChoiceRule()
        self._trees = [PrefixTree() for _ in range(num_replicas)]
        self._loads = [0] * num_replicas
        self._placed = [0] * num_replicas  # choices made for each replica
        self._up = [True] * num_replicas
        self._lock = threading.Lock()

    def choose(self, text: str) -> Choice:
        """Pick a replica for `text` and count one call as in flight there (the caller ends it
        with `finished`); the text joins that replica's tree."""
        with self._lock:
            choice = decide(self.rule, len(text), [t.match(text) for t in self._trees],
                            self._loads, [t.chars for t in self._trees], self._up)
            self._placed[choice.replica] += 1
            self._start(choice.replica, text)
            return choice

    def started(self, replica: int, text: str) -> None:
        """A call to a replica already chosen (a placed program's next call) begins."""
        with self._lock:
            self._start(replica, text)

    def finished(self, replica: int) -> None:
        with self._lock:
            if self._loads[replica] <= 0:
                raise RuntimeError(f"replica {replica}: finished() without a call in flight")
            self._loads[replica] -= 1

    def record(self, replica: int, text: str) -> None:
        """The replica now also holds `text` (a prompt with the output it generated)."""
        with self._lock:
            self._remember(replica, text)

    def mark_down(self, replica: int) -> None:
        """The replica exited or stopped answering: no more choices fall on it."""
        with self._lock:
            self._up[replica] = False

    def forget(self) -> None:
        """The replicas' caches were flushed: every tree starts empty again."""
        with self._lock:
            for tree in self._trees:
                tree.clear()

    def snapshot(self) -> dict[str, list[int]]:
        """Per replica: calls in flight, choices made, characters in its tree, up (1) or down."""
        with self._lock:
            return {"in_flight": list(self._loads), "placed": list(self._placed),
                    "tree_chars": [t.chars for t in self._trees],
                    "up": [int(u) for u in self._up]}

    def _start(self, replica: int, text: str) -> None:  # holds the lock
        self._loads[replica] += 1
        self._remember(replica, text)

    def _remember(self, replica: int, text: str) -> None:  # holds the lock
        tree = self._trees[replica]
        tree.insert(text)
        tree.evict(self.rule.max_tree_chars)
