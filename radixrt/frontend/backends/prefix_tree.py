"""PrefixTree: what a client believes one replica has cached, as a radix tree over characters.

A replica's real radix cache is over token ids, and only the replica knows what it evicted; a
client that spreads programs over replicas keeps an *approximate* copy instead, as the SGLang
router does: every text it sends to a replica is inserted into that replica's tree, and a new
text's longest match tells how much of it the replica probably still holds. Characters stand in
for tokens (no tokenizer on the client) and the tree forgets on its own schedule, so a match is
a guess that is cheap to make, never a promise.

Pure mechanism (insert, match, evict, check), one tree per replica. Edges carry strings and are
split where two texts part; `chars` counts the characters stored, which is what eviction bounds
and what "the smallest tree" compares. Each insert stamps the nodes on its path with a logical
clock, so a parent is never older than its children and the least recently used leaf is the one
to drop first.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Node:
    label: str  # the characters on the edge into this node ("" for the root)
    parent: _Node | None
    children: dict[str, _Node] = field(default_factory=dict)  # first character -> child
    last_used: int = 0  # the logical time of the latest insert through this node


def _common_length(a: str, b: str, start_a: int = 0) -> int:
    """How many characters a[start_a:] and b share at their start."""
    limit = min(len(a) - start_a, len(b))
    n = 0
    while n < limit and a[start_a + n] == b[n]:
        n += 1
    return n


class PrefixTree:
    def __init__(self) -> None:
        self._root = _Node("", None)
        self._clock = 0
        self.chars = 0  # characters stored on all edges

    def match(self, text: str) -> int:
        """The length of the longest prefix of `text` in the tree (a read: nothing changes)."""
        node, matched = self._root, 0
        while matched < len(text):
            child = node.children.get(text[matched])
            if child is None:
                break
            shared = _common_length(text, child.label, matched)
            matched += shared
            if shared < len(child.label):
                break
            node = child
        return matched

    def insert(self, text: str) -> int:
        """Add `text`; returns the number of new characters stored."""
        self._clock += 1
        node, pos = self._root, 0
        node.last_used = self._clock
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = _Node(text[pos:], node, last_used=self._clock)
                node.children[text[pos]] = leaf
                self.chars += len(leaf.label)
                return len(leaf.label)
            shared = _common_length(text, child.label, pos)
            if shared < len(child.label):
                child = self._split(child, shared)
            child.last_used = self._clock
            node, pos = child, pos + shared
        return 0

    def evict(self, max_chars: int) -> int:
        """Drop least recently used leaves until at most `max_chars` characters are stored;
        returns the characters dropped."""
        if self.chars <= max_chars:
            return 0
        before = self.chars
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(leaves)
        while self.chars > max_chars and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None  # the root is never a leaf here: chars > 0
            del parent.children[leaf.label[0]]
            self.chars -= len(leaf.label)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return before - self.chars

    def clear(self) -> None:
        self._root = _Node("", None)
        self.chars = 0

    def check(self) -> None:
        """Raise AssertionError unless the tree is well formed: every edge but the root's is
        non-empty and keyed by its first character, parents point back, no parent is older
        than a child, and `chars` is the sum of the edges."""
        total = 0
        for node in self._nodes():
            total += len(node.label)
            for first, child in node.children.items():
                assert child.label and child.label[0] == first, "edge keyed by its first char"
                assert child.parent is node, "parent link"
                assert child.last_used <= node.last_used, "a parent is never older"
        assert total == self.chars, f"chars {self.chars} != {total} stored"

    # --- internals ---------------------------------------------------------------------------
    def _split(self, child: _Node, at: int) -> _Node:
        """Cut child's edge after `at` characters: a new node takes the first part (and child's
        place under its parent); child keeps the rest, below it."""
        parent = child.parent
        assert parent is not None
        head = _Node(child.label[:at], parent, last_used=child.last_used)
        parent.children[head.label[0]] = head
        child.label = child.label[at:]
        child.parent = head
        head.children[child.label[0]] = child
        return head

    def _nodes(self) -> list[_Node]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
