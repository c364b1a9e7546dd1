"""Waiting-queue orderings. Small, swappable objects: each returns the queue in admission order."""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.radix_cache import RadixNode
from radixrt.runtime.scheduler.request import Request

# lpm sorts the waiting queue by cached prefix length; past this queue length the matching cost is
# not worth it and the policy falls back to fcfs.
LPM_FALLBACK_QUEUE_LEN = 128


class SchedulePolicy(Protocol):
    def order(self, waiting: list[Request], kv: KVManager) -> list[Request]: ...


class FCFS:
    """First come, first served."""

    def order(self, waiting: list[Request], kv: KVManager) -> list[Request]:
        return sorted(waiting, key=lambda r: r.arrival)


class LongestPrefixMatch:
    """Longest cached prefix first, so the requests that reuse the most run while it is cached
    (a token held in a lower KV tier counts less than one on the device: KVManager.match_value).
    Matching costs a tree walk per request: past `fallback_len` waiting requests, fcfs."""

    def __init__(self, fallback_len: int = LPM_FALLBACK_QUEUE_LEN) -> None:
        self.fallback_len = fallback_len

    def order(self, waiting: list[Request], kv: KVManager) -> list[Request]:
        if len(waiting) > self.fallback_len or kv.disable_radix_cache:
            return FCFS().order(waiting, kv)
        matched = {r.rid: kv.match_value(r) for r in waiting}
        return sorted(waiting, key=lambda r: (-matched[r.rid], r.arrival))


class DFSWeight:
    """Walk the radix tree depth first, heaviest subtree (most waiting requests) first, so that
    requests sharing a prefix run next to each other while that prefix is cached. Subtrees of
    equal weight go in the order of their earliest request (so an uncached queue is fcfs)."""

    def order(self, waiting: list[Request], kv: KVManager) -> list[Request]:
        if kv.disable_radix_cache or len(waiting) <= 1:
            return FCFS().order(waiting, kv)
        tree = kv.tree
        at_node: dict[int, list[Request]] = defaultdict(list)
        weight: dict[int, int] = defaultdict(int)
        first: dict[int, int] = {}  # earliest arrival in the subtree
        nodes: dict[int, RadixNode] = {}
        empty_roots: dict[str | None, RadixNode] = {}
        for req in sorted(waiting, key=lambda r: r.arrival):
            node = tree.match_prefix(kv.match_key(req), req.extra_key).node
            if node.parent is None:  # a namespace with nothing cached answers a fresh root
                node = empty_roots.setdefault(node.extra_key, node)
            at_node[id(node)].append(req)
            while node is not None:
                nodes[id(node)] = node
                weight[id(node)] += 1
                first.setdefault(id(node), req.arrival)
                node = node.parent

        def rank(n: RadixNode) -> tuple[int, int]:  # popped last = heaviest, then earliest
            return weight[id(n)], -first[id(n)]

        roots = [n for n in nodes.values() if n.parent is None]
        ordered: list[Request] = []
        stack = sorted(roots, key=rank)
        while stack:
            node = stack.pop()
            ordered.extend(at_node.get(id(node), ()))
            children = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            stack.extend(sorted(children, key=rank))
        return ordered


def make_policy(name: str) -> SchedulePolicy:
    if name == "fcfs":
        return FCFS()
    if name == "lpm":
        return LongestPrefixMatch()
    if name == "dfs-weight":
        return DFSWeight()
    raise ValueError(f"unknown schedule policy {name!r}; use fcfs, lpm or dfs-weight")
