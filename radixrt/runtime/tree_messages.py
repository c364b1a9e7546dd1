"""The wire messages of the radix tree's live view (GET /debug/radix_tree, the dashboard): a
request front asks for the top of the tree, the scheduler answers with a bounded snapshot
(scheduler/tree_view.py takes it). The reply travels in a ControlReply as plain builtins and is
converted back to `TreeView` on arrival, so both ends stay typed."""

from __future__ import annotations

import msgspec

MAX_TREE_DEPTH = 16  # depth= of GET /debug/radix_tree (levels below a namespace's root)
MAX_TREE_NODES = 1000  # limit=: nodes in one answer
DEFAULT_TREE_DEPTH = 6
DEFAULT_TREE_NODES = 200
TEXT_HEAD_TOKENS = 24  # a node's first tokens sent back when its text may be shown


class TreeViewRequest(msgspec.Struct, frozen=True, tag=True):
    """The top of the tree: at most `limit` nodes, none deeper than `depth` below its namespace's
    root; with `text_tokens` > 0 each node's first tokens too (its text is private by default)."""

    call_id: int
    depth: int = DEFAULT_TREE_DEPTH
    limit: int = DEFAULT_TREE_NODES
    text_tokens: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.depth <= MAX_TREE_DEPTH:
            raise ValueError(f"depth={self.depth} is invalid: use 1..{MAX_TREE_DEPTH}")
        if not 1 <= self.limit <= MAX_TREE_NODES:
            raise ValueError(f"limit={self.limit} is invalid: use 1..{MAX_TREE_NODES}")
        if not 0 <= self.text_tokens <= TEXT_HEAD_TOKENS:
            raise ValueError(f"text_tokens={self.text_tokens} is invalid: use "
                             f"0..{TEXT_HEAD_TOKENS}")


class TreeViewNode(msgspec.Struct, frozen=True):
    """One node of the view. A namespace's root has depth 0, no tokens and parent -1; `id`s
    are the answer's own (an index into `TreeView.nodes`), never the same across answers."""

    id: int
    parent: int
    depth: int
    tokens: int  # of this node's own edge
    subtree_tokens: int  # this node's and every scanned node's below it
    hits: int  # requests that took a cached prefix through this node
    tier: str  # "device" | "host" | "disk"
    locks: int  # requests (and pins) using this node or a node below it
    children: int  # all of its children, shown or not
    idle_s: float  # since a request last matched or inserted through it
    namespace: str  # "default", "lora:<adapter>" or "salt:<digest>" (a cache_salt's hash)
    head_ids: list[int] = []  # its first tokens, only when asked for (text_tokens > 0)
    text: str | None = None  # head_ids decoded, filled in by the request front


class TreeView(msgspec.Struct, frozen=True):
    """A snapshot of the tree's top: `nodes` parents before children; `scanned` nodes were
    walked (at most the scheduler's scan budget: `complete` False when the tree had more, and
    the subtree sizes count only what was walked); the largest subtrees of them are `nodes`."""

    nodes: list[TreeViewNode]
    scanned: int
    complete: bool
    page_size: int
    cached_tokens: dict[str, int]  # the tree's tokens in each tier
    elapsed_s: float  # the scheduler's time taking it
