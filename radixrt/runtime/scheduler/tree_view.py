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
files' digest; the request front names the adapter) and "salt:<hmac>", an HMAC under a secret of
the scheduler process, so a label cannot be turned back into the salt by trying salts. The first
tokens of a node (its text, when the server shows text) are never sent for a salted namespace:
a salt says its prompts are someone's own. With more namespaces than a quarter of the budget,
the unsalted ones (the default, the adapters') come first, then those with locked nodes (in
use), then the most recently made.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import time
from collections.abc import Callable

from radixrt.runtime.messages import TIER_NAMES
from radixrt.runtime.models.lora_format import split_namespace
from radixrt.runtime.scheduler.radix_cache import RadixCache
from radixrt.runtime.scheduler.radix_node import RadixNode
from radixrt.runtime.tree_messages import TreeView, TreeViewNode, TreeViewRequest

SCAN_BUDGET = 10_000  # nodes walked per snapshot: ~10 ms of the step loop on a slow CPU
MAX_NAMESPACES = SCAN_BUDGET // 4  # namespace roots walked at most
IN_USE_PEEK = 16  # children of a namespace's root looked at for a lock (in use now)
SALT_LABEL_DIGITS = 12


def namespace_label(extra_key: str | None, secret: bytes) -> str:
    """A namespace's name for the view, which never shows a cache_salt itself."""
    key, salt = split_namespace(extra_key)
    salted = None if salt is None else f"salt:{_salt_label(salt, secret)}"
    if key is None:
        return salted or "default"
    return f"lora:{key}" + ("" if salted is None else f"/{salted}")


def is_salted(extra_key: str | None) -> bool:
    return split_namespace(extra_key)[1] is not None


def _salt_label(salt: str, secret: bytes) -> str:
    digest = hmac.new(secret, salt.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return digest.hexdigest()[:SALT_LABEL_DIGITS]


def _roots(tree: RadixCache) -> tuple[list[RadixNode], bool]:
    """The namespaces' roots to walk (those with nodes), and whether they are all of them."""
    roots = [r for r in [tree.root(None), *tree.namespaces("")] if r.children]
    if len(roots) <= MAX_NAMESPACES:
        return roots, True
    def in_use(root: RadixNode) -> bool:  # a request holds a node of it (its first children)
        return any(c.lock_count for c in itertools.islice(root.children.values(), IN_USE_PEEK))

    chosen = heapq.nlargest(MAX_NAMESPACES, range(len(roots)),
                            key=lambda i: (not is_salted(roots[i].extra_key), in_use(roots[i]),
                                           i))
    return [roots[i] for i in sorted(chosen)], False


def snapshot(tree: RadixCache, request: TreeViewRequest, secret: bytes,
             clock: Callable[[], float] = time.monotonic,
             scan_budget: int = SCAN_BUDGET) -> TreeView:
    """The top of `tree` as `request` asks (see the module's docstring); `secret` keys the
    salts' labels."""
    started = time.perf_counter()
    now = clock()
    roots, complete = _roots(tree)
    # breadth first: walked[i] = (node, index of its parent in walked or -1, depth)
    walked: list[tuple[RadixNode, int, int]] = [(root, -1, 0) for root in roots]
    head = 0
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
    labels = {root.extra_key: namespace_label(root.extra_key, secret) for root in roots}
    nodes = [_view_node(walked[i], new_id, sizes[i], now, request.text_tokens, new, labels)
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
               now: float, text_tokens: int, node_id: int,
               labels: dict[str | None, str]) -> TreeViewNode:
    node, parent, depth = entry
    root = depth == 0
    text_tokens = 0 if is_salted(node.extra_key) else text_tokens
    return TreeViewNode(
        id=node_id, parent=new_id.get(parent, -1), depth=depth, tokens=len(node.key),
        subtree_tokens=size, hits=node.hits, tier=TIER_NAMES[node.tier],
        locks=node.lock_count, children=len(node.children),
        idle_s=0.0 if root else round(max(now - node.last_access, 0.0), 3),
        namespace=labels[node.extra_key],
        head_ids=list(node.key[:text_tokens]) if text_tokens else [])
