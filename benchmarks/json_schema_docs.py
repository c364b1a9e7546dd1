"""What benchmarks/json_schema_bench.py and the compiler's JSONSchemaBench test
(tests/runtime/constrained/test_compiler_jsonschemabench.py) share: where JSONSchemaBench's data
is, the stratified sample of its schemas, random walks through a grammar's masks, and documents
made invalid by mutating a valid one, fed back through the grammar token by token.

A grammar engine is read through `DocMatcher` (one output's state: the text tokens its mask
allows, advance, whether the output may end here), so radixrt's GrammarState and the engines
driven directly (llguidance's LLMatcher, XGrammar's GrammarMatcher) are walked and fed alike.

Documents are written as radixrt writes JSON under a schema: compact (no whitespace,
`separators=(",", ":")`), non-ASCII characters as they are (`ensure_ascii=False`; escaped only
where a string holds a lone surrogate, which UTF-8 cannot carry), so that a rejection is about
content, never about formatting. `jsonschema` decides what is invalid (formats are not
checked: `jsonschema`'s default)."""

from __future__ import annotations

import decimal
import json
import os
import random
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TARBALL = os.path.join(REPO, "..", "shared", "jsonschemabench",
                              "jsonschemabench-data.tar.xz")
EXTRACTED = "/tmp/jsb/data"  # where the docs' command extracts it (used when there)
UNKNOWN_KEY = "x-unlisted-key"  # the key "add key" mutations add (no schema lists it)
LONG_TAIL = "x" * 1100  # "long string" appends it: past any maxLength up to 1100
BITS = 32
_NOT_JSON = object()  # a truncation that is no JSON document at all


# --- the data ---------------------------------------------------------------------------------
def find_data(path: str | None = None, tarball: str = SHARED_TARBALL) -> str | None:
    """JSONSchemaBench's data folder: `path` when given (None if it is not a folder), else
    /tmp/jsb/data when it is there, else the shared tarball extracted into a new temporary
    folder (about 1 s); None when there is neither."""
    if path is not None:
        return path if os.path.isdir(path) else None
    if os.path.isdir(EXTRACTED):
        return EXTRACTED
    return extract(tarball, tempfile.mkdtemp(prefix="jsonschemabench-"))


def extract(tarball: str, into: str) -> str | None:
    """Extract the tarball's data/ folder into `into`; its path, or None without the tarball."""
    if not os.path.isfile(tarball):
        return None
    with tarfile.open(tarball, "r:xz") as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith("data/") and (m.isfile() or m.isdir())]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
        archive.extractall(into, members=members, **safe)
    return os.path.join(into, "data")


def sample(data: str, per_folder: int) -> list[tuple[str, str, str]]:
    """(folder, file, schema text): per_folder files spread over each folder in name order."""
    out = []
    for folder in sorted(os.listdir(data)):
        files = sorted(f for f in os.listdir(os.path.join(data, folder)) if f.endswith(".json"))
        step = max(len(files) // per_folder, 1)
        for name in files[::step][:per_folder]:
            with open(os.path.join(data, folder, name)) as f:
                value = json.load(f)
            schema = value.get("json_schema", value) if isinstance(value, dict) else value
            out.append((folder, name, json.dumps(schema)))
    return out


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


# --- validity ---------------------------------------------------------------------------------
def validator_of(schema_text: str) -> Callable[[Any], bool | None]:
    """A document -> valid under the schema (jsonschema, the schema's own draft, multipleOf
    decided in decimal: -39.8 is a multiple of 0.01, which float division denies); None where
    jsonschema cannot judge (a reference it cannot resolve, a pattern Python's re rejects)."""
    import jsonschema

    schema = json.loads(schema_text)
    try:
        base = jsonschema.validators.validator_for(schema)
        exact = jsonschema.validators.extend(base, {"multipleOf": _multiple_of})
        validator = exact(schema)
    except Exception:  # noqa: BLE001 -- a schema jsonschema cannot even load
        return lambda doc: None

    def valid(doc: Any) -> bool | None:
        try:
            return bool(validator.is_valid(doc))
        except Exception:  # noqa: BLE001 -- RefResolutionError, re.error, RecursionError, ...
            return None

    return valid


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's multipleOf on the numbers as JSON writes them (shortest decimal repr)."""
    import jsonschema

    if not validator.is_type(instance, "number") or not isinstance(divisor, (int, float)):
        return
    try:
        with decimal.localcontext() as context:
            context.prec = 1000
            rest = Decimal(repr(instance)) % Decimal(repr(divisor))
    except (decimal.InvalidOperation, ValueError):  # inf, nan, a zero divisor
        return
    if rest != 0:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {divisor}")


def compact(value: Any) -> bytes:
    """The document as radixrt writes JSON: compact, non-ASCII as it is. ValueError for a
    number Python read as infinite (a walk's 97E1168375): JSON cannot write it back."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: only its escape is valid UTF-8
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def writable(value: Any) -> bool:
    """Whether compact can write the document (every number finite)."""
    try:
        compact(value)
    except ValueError:
        return False
    return True


# --- mutations --------------------------------------------------------------------------------
def _nodes(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, (*path, i))


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _other_types(node: Any) -> list[Any]:
    """Two values of other JSON types than node's."""
    if node is None or isinstance(node, bool):
        return ["x", 0] if node is None else [None, "true"]
    if isinstance(node, (int, float)):
        return [str(node), None]
    if isinstance(node, str):
        return [0, None]
    return ["x", None] if isinstance(node, (dict, list)) else [None]


def mutations(doc: Any, max_nodes: int = 64) -> list[tuple[str, Any]]:
    """(kind, mutated document) for the first max_nodes nodes of doc: a key dropped, an
    unlisted key added, a value of another type, an enum / const / pattern broken (a string
    changed, a number moved by one, a boolean flipped), a number pushed far past any bound or
    made fractional, a string emptied or made 1100 characters longer, an array emptied, cut
    short, grown by a copy of its last item or by an item of another type. Some are still
    valid under the schema: invalid_documents keeps the others."""
    out: list[tuple[str, Any]] = []
    for count, (path, node) in enumerate(_nodes(doc)):
        if count >= max_nodes:
            break

        def put(kind: str, new: Any, path: tuple = path) -> None:
            out.append((kind, _replace(doc, path, new)))

        for other in _other_types(node):
            put("type changed", other)
        if isinstance(node, dict):
            for key in node:
                put("key dropped", {k: v for k, v in node.items() if k != key})
            if UNKNOWN_KEY not in node:
                put("key added", {**node, UNKNOWN_KEY: 0})
            if node:
                put("object emptied", {})
        elif isinstance(node, list):
            if node:
                put("item dropped", node[:-1])
                put("item repeated", [*node, node[-1]])
                put("array emptied", [])
            put("item added", [*node, 0 if node and isinstance(node[-1], str) else "x"])
        elif isinstance(node, bool):
            put("boolean flipped", not node)
        elif isinstance(node, (int, float)):
            put("number moved", node + 1)
            put("number moved", node - 1)
            put("number past a bound", node + 10**9)
            put("number past a bound", node - 10**9)
            put("number made fractional", node + 0.5)
        elif isinstance(node, str):
            put("string changed", node + "x")
            put("string changed", "#" + node)
            put("string emptied", "")
            put("long string", node + LONG_TAIL)
    return out


def truncations(text: bytes) -> list[bytes]:
    """The document cut short (at a character): one character less, half, the first one."""
    chars = text.decode()
    cuts = {chars[:-1], chars[: len(chars) // 2], chars[:1]} - {"", chars}
    return sorted((cut.encode() for cut in cuts), key=len)


def invalid_documents(doc: Any, valid: Callable[[Any], bool | None], limit: int,
                      rng: random.Random) -> list[tuple[str, bytes]]:
    """Up to `limit` distinct mutations of doc (a valid, writable document) that the schema
    finds invalid, as (kind, compact bytes): the kinds taken round-robin (truncations first),
    each kind's mutations in a random order; at most 8 * limit of them checked."""
    original = compact(doc)
    by_kind: dict[str, list[tuple[Any, bytes]]] = {"truncated": []}
    for cut in truncations(original):
        try:
            by_kind["truncated"].append((json.loads(cut), cut))
        except ValueError:
            by_kind["truncated"].append((_NOT_JSON, cut))
    for kind, value in mutations(doc):
        if writable(value):  # a number pushed past the largest float is not
            by_kind.setdefault(kind, []).append((value, compact(value)))
    for pending in by_kind.values():
        rng.shuffle(pending)
    out: list[tuple[str, bytes]] = []
    seen = {original}
    checks = 8 * limit
    while len(out) < limit and checks > 0 and any(by_kind.values()):
        for kind, pending in by_kind.items():
            if not pending or len(out) >= limit or checks <= 0:
                continue
            value, text = pending.pop()
            if text in seen:
                continue
            seen.add(text)
            checks -= 1
            if value is _NOT_JSON or valid(value) is False:
                out.append((kind, text))
    return out


# --- walking and feeding a grammar ------------------------------------------------------------
class DocMatcher(Protocol):
    """One output's place in a compiled schema, whatever the engine."""

    def write_mask(self, words: torch.Tensor) -> None:
        """Fill [ceil(vocab / 32)] int32 words with the allowed text tokens (no EOS)."""

    def advance(self, token: int) -> bool:
        """Take a token (EOS included); False where the grammar refuses it."""

    def accepts_end(self) -> bool:
        """Whether the output may end (EOS) here."""


class StateMatcher:
    """radixrt's GrammarState as a DocMatcher."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def write_mask(self, words: torch.Tensor) -> None:
        self.state.write_mask(words)

    def advance(self, token: int) -> bool:
        try:
            self.state.advance(token)
        except ValueError:
            return False
        return True

    def accepts_end(self) -> bool:
        return self.state.accepts_end()


def allows(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token // BITS]) >> (token % BITS)) & 1)


def closer_tokens(token_bytes: Sequence[bytes | None]) -> np.ndarray:
    """[vocab] bool: the tokens with a byte that closes a string, an object or an array."""
    return np.array([bool(data) and any(c in data for c in b'"}]') for data in token_bytes])


def allowed_tokens(words: torch.Tensor, vocab_size: int) -> np.ndarray:
    """[vocab] bool: the tokens a mask allows."""
    bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def walk(matcher: DocMatcher, words: torch.Tensor, eos: int, rng: random.Random,
         max_tokens: int, closers: np.ndarray, mask_us: list[float] | None = None,
         mask_cpu_us: list[float] | None = None) -> list[int] | None:
    """A random output: each step, a token drawn from the mask (half the time from its tokens
    that close a string, object or array, where it has some: a walk through a big schema
    otherwise seldom ends), EOS with probability 1/2 where the output may end. Its text
    tokens, or None when it did not end within max_tokens (or the mask was empty). Each
    mask's time goes to mask_us (wall-clock µs) and mask_cpu_us (the thread's CPU µs: the
    same less the time other processes had the core, which a shared machine's scheduler
    hands out in 4 ms slices)."""
    vocab_size = len(closers)
    out: list[int] = []
    for _ in range(max_tokens):
        if matcher.accepts_end() and rng.random() < 0.5:
            return out if matcher.advance(eos) else None
        words.zero_()
        start, start_cpu = time.perf_counter(), time.thread_time()
        matcher.write_mask(words)
        if mask_us is not None:
            mask_us.append((time.perf_counter() - start) * 1e6)
        if mask_cpu_us is not None:
            mask_cpu_us.append((time.thread_time() - start_cpu) * 1e6)
        allowed = allowed_tokens(words, vocab_size)
        if rng.random() < 0.5 and (allowed & closers).any():
            allowed = allowed & closers
        choices = np.flatnonzero(allowed)
        if not len(choices):
            return out if matcher.accepts_end() and matcher.advance(eos) else None
        token = int(choices[rng.randrange(len(choices))])
        if not matcher.advance(token):
            return None
        out.append(token)
    return None


def accepts(matcher: DocMatcher, tokens: Sequence[int], words: torch.Tensor, eos: int) -> bool:
    """Whether the grammar takes the whole document: every token allowed by the mask where it
    comes (and taken by advance), then the end (EOS) allowed."""
    view = words.numpy()
    for token in tokens:
        words.zero_()
        matcher.write_mask(words)
        if not allows(view, token) or not matcher.advance(token):
            return False
    return matcher.accepts_end() and matcher.advance(eos)


def doc_tokens(text: bytes, encode: Callable[[str], list[int]],
               token_bytes: Sequence[bytes | None]) -> list[int] | None:
    """The tokenizer's split of a document, None where its tokens do not spell it back."""
    tokens = encode(text.decode())
    if b"".join(token_bytes[t] or b"\xff" for t in tokens) != text:
        return None
    return tokens
