"""Where short runs of tokens occur, and what followed them: the drafts of speculative decoding.

Speculative decoding (speculator.py) asks, for a decoding request: its last NGRAM tokens, where
else did they occur, and what came next? Two places answer: the radix tree (every sequence the
server has recently seen, within the request's namespace) through `DraftIndex`, and the request's
own tokens through `ContextIndex`. Each answer comes with the length of the match it follows (the
n-gram and how far before it the tokens agree too), so the speculator can take the longer one.
The tree is matched on NGRAM tokens; a request's own tokens on NGRAM, else fewer, down to one
(a name copied from the prompt is drafted from its first token on).

DraftIndex keeps itself exact by listening to the tree (radix_cache.TreeListener), never walking
it:

- Tokens enter the tree only as new leaves (`added`). A leaf's key, with up to NGRAM - 1 tokens of
  the path above it in front, becomes a `TokenRun`; every position p of it that ends an NGRAM
  inside the leaf's own tokens is filed under the hash of (namespace, those NGRAM tokens): the
  continuation starts at p (p may be the run's end: the continuation is then below it in the tree).
- A split only cuts a run into nodes: each node maps to the span of its run that it holds, and
  `split` divides that span between the two parts.
- Tokens leave the tree only as evicted leaves (`removed`), so the bottom of a run's path goes
  first and what is left of a run is always a prefix of it: the evicted span's positions are
  unfiled and the run ends where it now ends, at its deepest node left (its `tail`).

Lookup hashes the request's last NGRAM tokens, checks each candidate's tokens (hashes collide),
prefers the candidate whose match reaches furthest back (ties: the newest), and reads up to k
tokens after it: the rest of its run, then down the tree from the run's tail, each time through
the child used most recently. A draft tree asks for several continuations (`lookup_paths`): where
that reading passes a node with other children (inside the candidate's run, where a later
sequence split it, or below it), down those too; then the other candidates'. Each filed n-gram
keeps its newest MAX_CANDIDATES places, so the index holds about one entry per cached token, and
finding the match costs O(MAX_CANDIDATES * MAX_BACK_MATCH) whatever the tree's size (a
continuation also walks the nodes of its run and scans the children of each node it passes).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.runtime.scheduler.radix_cache import RadixNode

# Drafts follow a match of this many tokens (fewer matches by chance too often to pay).
NGRAM = 3
# A request's own tokens are indexed over its last this many (the first lookup of a long prompt
# costs the scheduler milliseconds per 10k tokens, and the index stays as long as the request).
CONTEXT_WINDOW = 8192
# Places kept per n-gram (the newest), and how far back a candidate's match is compared.
MAX_CANDIDATES = 4
MAX_BACK_MATCH = 32


class TokenRun:
    """The tokens one leaf brought into the tree, after up to NGRAM - 1 tokens of its path above.
    tokens[:alive] are still in the tree; `tail` is the run's deepest node left (None: gone)."""

    __slots__ = ("tokens", "offset", "alive", "tail", "extra_key")

    def __init__(self, tokens: tuple[int, ...], offset: int, tail: RadixNode) -> None:
        self.extra_key = tail.extra_key  # its namespace
        self.tokens = tokens
        self.offset = offset  # where the leaf's own tokens start
        self.alive = len(tokens)
        self.tail: RadixNode | None = tail


def _match_len(tokens: Sequence[int], end: int, context: Sequence[int], ngram: int) -> int:
    """The n-gram ending at `end` of `tokens` matches the context's last n-gram: how many tokens
    match in all, counting back from there (at most ngram + MAX_BACK_MATCH)."""
    n = 0
    limit = min(end - ngram, len(context) - ngram, MAX_BACK_MATCH)
    while n < limit and tokens[end - ngram - 1 - n] == context[-ngram - 1 - n]:
        n += 1
    return ngram + n


class DraftIndex:
    """The radix tree's n-grams, for drafts (see the module docstring); a TreeListener."""

    def __init__(self, ngram: int = NGRAM) -> None:
        self.ngram = ngram
        self._spans: dict[int, tuple[TokenRun, int, int]] = {}  # id(node) -> its run's span
        self._filed: dict[int, list[tuple[TokenRun, int]]] = {}  # n-gram hash -> places
        self.entries = 0  # places filed now (bounded by the tree's tokens)

    # --- TreeListener --------------------------------------------------------------------------
    def added(self, leaf: RadixNode) -> None:
        context = self._above(leaf.parent, self.ngram - 1)
        tokens = context + leaf.key
        run = TokenRun(tokens, len(context), leaf)
        self._spans[id(leaf)] = (run, run.offset, len(tokens))
        for p in range(max(self.ngram, run.offset + 1), len(tokens) + 1):
            self._file(self._key(leaf.extra_key, tokens, p), run, p)

    def split(self, upper: RadixNode, lower: RadixNode) -> None:
        span = self._spans.get(id(lower))
        if span is None:
            return
        run, start, end = span
        cut = start + len(upper.key)
        self._spans[id(upper)] = (run, start, cut)
        self._spans[id(lower)] = (run, cut, end)

    def removed(self, leaf: RadixNode) -> None:
        span = self._spans.pop(id(leaf), None)
        if span is None:
            return
        run, start, end = span
        for p in range(max(self.ngram, start + 1), end + 1):
            self._unfile(self._key(leaf.extra_key, run.tokens, p), run, p)
        run.alive = start
        run.tail = leaf.parent if start > run.offset else None

    def cleared(self) -> None:
        self._spans.clear()
        self._filed.clear()
        self.entries = 0

    # --- lookup --------------------------------------------------------------------------------
    def lookup(self, extra_key: str | None, context: Sequence[int],
               k: int) -> tuple[int, list[int]]:
        """Up to k tokens that followed the context's last n-gram in the tree (its namespace
        `extra_key` only), and the length of the match they follow ((0, []): none)."""
        paths = self.lookup_paths(extra_key, context, k, 1)
        return paths[0] if paths else (0, [])

    def lookup_paths(self, extra_key: str | None, context: Sequence[int], k: int,
                     width: int) -> list[tuple[int, list[int]]]:
        """Up to `width` different continuations (each up to k tokens) of the context's last
        n-gram in the tree, best first, each with the length of the match it follows. Best:
        the candidate place whose match reaches furthest back (ties: the newest), read on down
        the most recently used child; then where that reading passes a node with other
        children, the continuations down those (most recent first; the same match); then the
        other places' continuations."""
        n = self.ngram
        if k <= 0 or len(context) < n:
            return []
        last = tuple(context[-n:])
        found: list[tuple[int, int, TokenRun, int]] = []  # (match length, newness, run, p)
        for age, (run, p) in enumerate(self._filed.get(hash((extra_key, *last)), ())):
            if run.tokens[p - n : p] != last or run.extra_key != extra_key:
                continue  # another n-gram (or namespace) with the same hash
            found.append((_match_len(run.tokens, p, context, n), age, run, p))
        found.sort(key=lambda f: (f[0], f[1]), reverse=True)
        paths: list[tuple[int, list[int]]] = []
        for length, _, run, p in found:
            for path in self._continuations(run, p, k, width):
                if len(paths) < width and path and all(path != q for _, q in paths):
                    paths.append((length, path))
        return paths

    def _continuations(self, run: TokenRun, p: int, k: int, width: int) -> list[list[int]]:
        """What follows position p of `run`, up to k tokens: the rest of the run, then down the
        most recently used child below its tail; and (up to width in all) where that reading
        passes a node with other children (a later sequence that parted from this one inside
        the run, or below it), down each of those, most recent first."""
        head = list(run.tokens[p : min(p + k, run.alive)])
        paths = [head]
        nodes = self._run_nodes(run, p)
        for (node, end), (after, _) in zip(nodes, nodes[1:]):  # forks inside the run
            cut = end - p
            if cut >= k or len(paths) >= width:
                break
            others = [c for c in _by_recency(node) if c is not after]
            paths += [_down(head[:cut] + list(c.key[: k - cut]), c, k)
                      for c in others[: width - len(paths)]]
        node = run.tail if p + len(head) == run.alive else None
        while len(head) < k and node is not None and node.children:
            ranked = _by_recency(node)
            paths += [_down(head + list(c.key[: k - len(head)]), c, k)
                      for c in ranked[1 : 1 + max(width - len(paths), 0)]]
            node = ranked[0]
            head.extend(node.key[: k - len(head)])
        return paths

    def _run_nodes(self, run: TokenRun, p: int) -> list[tuple[RadixNode, int]]:
        """The nodes of `run` still in the tree that hold its positions from p - 1 on (where a
        continuation at p may part), top down, each with the end of its span (a run's nodes are
        a path up from its tail)."""
        nodes: list[tuple[RadixNode, int]] = []
        node = run.tail
        while node is not None:
            span = self._spans.get(id(node))
            if span is None or span[0] is not run or span[2] < p:
                break
            nodes.append((node, span[2]))
            node = node.parent
        return nodes[::-1]

    # --- internals -----------------------------------------------------------------------------
    @staticmethod
    def _above(node: RadixNode | None, want: int) -> tuple[int, ...]:
        """The last `want` tokens of the path from the root down to `node` (fewer near the
        root)."""
        parts: list[tuple[int, ...]] = []
        have = 0
        while want > have and node is not None and node.parent is not None:
            part = node.key[-(want - have) :]
            parts.append(part)
            have += len(part)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    def _key(self, extra_key: str | None, tokens: tuple[int, ...], p: int) -> int:
        return hash((extra_key, *tokens[p - self.ngram : p]))

    def _file(self, key: int, run: TokenRun, p: int) -> None:
        places = self._filed.setdefault(key, [])
        if len(places) >= MAX_CANDIDATES:
            places.pop(0)  # the oldest place goes
            self.entries -= 1
        places.append((run, p))
        self.entries += 1

    def _unfile(self, key: int, run: TokenRun, p: int) -> None:
        places = self._filed.get(key)
        if not places:
            return
        for i, (r, q) in enumerate(places):
            if r is run and q == p:
                del places[i]
                self.entries -= 1
                break
        if not places:
            del self._filed[key]


def _by_recency(node: RadixNode) -> list[RadixNode]:
    """A node's children, the most recently used first."""
    return sorted(node.children.values(), key=lambda c: (c.last_access, c.tick), reverse=True)


def _down(path: list[int], node: RadixNode, k: int) -> list[int]:
    """`path`, which ends in `node`'s tokens, read on down the most recently used children."""
    while len(path) < k and node.children:
        node = max(node.children.values(), key=lambda c: (c.last_access, c.tick))
        path.extend(node.key[: k - len(path)])
    return path


class ContextIndex:
    """The n-grams of one request's own tokens (prompt and outputs; the last CONTEXT_WINDOW of
    them), of NGRAM tokens and fewer down to one, filed as the tokens grow: the newest earlier
    place of each."""

    __slots__ = ("ngram", "_filed", "_upto")

    def __init__(self, ngram: int = NGRAM) -> None:
        self.ngram = ngram
        self._filed: dict[int, int] = {}  # hash of (n, n-gram) -> where its continuation starts
        self._upto = 0  # continuations filed so far: those starting at 1 .. _upto

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[int, list[int]]:
        """Up to k tokens that followed the newest earlier place of the longest last n-gram of
        `tokens` (the request's tokens, a list that only grows) found earlier, and the length of
        the match they follow ((0, []): none)."""
        first = max(self._upto + 1, len(tokens) - CONTEXT_WINDOW)
        for p in range(first, len(tokens)):  # never the last n-gram itself
            for n in range(1, min(self.ngram, p) + 1):
                self._filed[hash((n, *tokens[p - n : p]))] = p
        self._upto = max(self._upto, len(tokens) - 1)
        if k <= 0:
            return 0, []
        for n in range(min(self.ngram, len(tokens)), 0, -1):
            last = tuple(tokens[-n:])
            p = self._filed.get(hash((n, *last)), -1)
            if p >= 0 and tuple(tokens[p - n : p]) == last:  # not another n-gram's hash
                return _match_len(tokens, p, tokens, n), list(tokens[p : p + k])
        return 0, []
