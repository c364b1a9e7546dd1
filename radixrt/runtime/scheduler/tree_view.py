"""A bounded snapshot of the radix tree's top, for GET /debug/radix_tree and the dashboard.

The scheduler takes it between steps, so its cost is a pause of the step loop: the walk visits at
most SCAN_BUDGET nodes (breadth first over every namespace, so the top of the tree is seen first
whatever its size; of a node with more children than the budget has room for, the most hit ones
among at most SCAN_BUDGET of them) and keeps nothing but plain numbers. Then:

1. each walked node's subtree size is summed bottom-up over the walked nodes (`complete` is
   False when the budget ran out first: the deepest parts were not counted);
2. the answer keeps the `limit` largest subtrees no deeper than `depth` below their namespace's
   root, the larger first and, of equal sizes, the shallower first; a parent's subtree is never
   smaller than its child's, so every kept node's parent is kept too and the answer is a tree.

Namespaces are labelled without revealing a cache_salt: "default", "lora:<key>" (an adapter's
files' digest; the request front names the adapter) and "salt:<hash>".
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import time
from collections.abc import Callable

from radixrt.runtime.messages import TIER_NAMES
from radixrt.runtime.scheduler.radix_cache import RadixCache
from radixrt.runtime.scheduler.radix_node import RadixNode
from radixrt.runtime.tree_messages import TreeView, TreeViewNode, TreeViewRequest

SCAN_BUDGET = 10_000  # nodes walked per snapshot: ~10 ms of the step loop on a slow CPU
LORA_MARK = "\x00lora:"
SALT_HASH_DIGITS = 8


def namespace_label(extra_key: str | None) -> str:
    """A namespace's name for the view, which never shows a cache_salt itself."""
    if extra_key is None:
        return "default"
    if extra_key.startswith(LORA_MARK):
        key, _, salt = extra_key[len(LORA_MARK):].partition("\x00")
        return f"lora:{key}" + (f"/salt:{_salt_hash(salt)}" if salt else "")
    return f"salt:{_salt_hash(extra_key)}"


def _salt_hash(salt: str) -> str:
    return hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:SALT_HASH_DIGITS]


def snapshot(tree: RadixCache, request: TreeViewRequest,
             clock: Callable[[], float] = time.monotonic,
             scan_budget: int = SCAN_BUDGET) -> TreeView:
    """The top of `tree` as `request` asks (see the module's docstring)."""
    started = time.perf_counter()
    now = clock()
    roots = [r for r in [tree.root(None), *tree.namespaces("")] if r.children]
    # breadth first: walked[i] = (node, index of its parent in walked or -1, depth)
    walked: list[tuple[RadixNode, int, int]] = [(root, -1, 0) for root in roots]
    head = 0
    complete = True
    while head < len(walked) and len(walked) < scan_budget:
        node, _, depth = walked[head]
        children = _children(node, scan_budget - len(walked))
        complete = complete and len(children) == len(node.children)
        walked.extend((child, head, depth + 1) for child in children)
        head += 1
    complete = complete and all(not node.children for node, _, _ in walked[head:])
    sizes = [len(node.key) for node, _, _ in walked]
    for i in range(len(walked) - 1, -1, -1):  # children come after their parents
        parent = walked[i][1]
        if parent >= 0:
            sizes[parent] += sizes[i]
    order = sorted((i for i, (_, _, d) in enumerate(walked) if d <= request.depth),
                   key=lambda i: (-sizes[i], walked[i][2], i))[: request.limit]
    order.sort(key=lambda i: (walked[i][2], i))  # parents before children
    new_id = {old: new for new, old in enumerate(order)}
    nodes = [_view_node(walked[i], new_id, sizes[i], now, request.text_tokens, new)
             for new, i in enumerate(order)]
    ps = tree.page_size
    return TreeView(nodes=nodes, scanned=len(walked), complete=complete, page_size=ps,
                    cached_tokens={name: tree.tier_pages(t) * ps
                                   for t, name in enumerate(TIER_NAMES)},
                    elapsed_s=time.perf_counter() - started)


def _children(node: RadixNode, room: int) -> list[RadixNode]:
    """`node`'s children, or where more than `room`, the most used of (at most a scan
    budget of) them: a node with a hundred thousand children costs no more than the budget."""
    if len(node.children) <= room:
        return list(node.children.values())
    some = itertools.islice(node.children.values(), SCAN_BUDGET)
    return heapq.nlargest(room, some, key=lambda c: (c.hits, c.last_access))


def _view_node(entry: tuple[RadixNode, int, int], new_id: dict[int, int], size: int,
               now: float, text_tokens: int, node_id: int) -> TreeViewNode:
    node, parent, depth = entry
    root = depth == 0
    return TreeViewNode(
        id=node_id, parent=new_id.get(parent, -1), depth=depth, tokens=len(node.key),
        subtree_tokens=size, hits=node.hits, tier=TIER_NAMES[node.tier],
        locks=node.lock_count, children=len(node.children),
        idle_s=0.0 if root else round(max(now - node.last_access, 0.0), 3),
        namespace=namespace_label(node.extra_key),
        head_ids=list(node.key[:text_tokens]) if text_tokens else [])
