"""outlines-core's compile in a child process the compiler can stop: an Index over a big
automaton can take minutes (and a schema's regex check tens of seconds), holding a thread no one
can interrupt. The child checks the constraint and builds the index; past the time limit the
parent kills it (a fresh child takes the next job) and the request is refused naming the limit.

The child is a HelperProcess (started by module path: never a re-import of the user's script).
It gets the vocabulary once, as its argument; jobs and replies are msgspec messages, each a
length-prefixed frame over a socket pair (never pickles)."""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.helper_process import HelperProcess

START_TIMEOUT_S = 120.0  # a child that is not ready by then is a broken install


class VocabularySpec(msgspec.Struct, frozen=True):
    """What the child needs of a TokenTable: outlines-core's Vocabulary and the end marker."""

    eos_token_id: int
    entries: list[tuple[bytes, list[int]]]  # token bytes -> the ids with those bytes
    marker_token: int  # the end marker's single-byte token, -1 where there is none


class IndexChildArgs(msgspec.Struct, frozen=True):
    """The child's argument: its end of the socket pair, and the vocabulary."""

    channel_fd: int
    vocabulary: VocabularySpec


class IndexJob(msgspec.Struct, frozen=True):
    kind: str
    pattern: str | list[str]
    check_only: bool = False  # the check alone (the Engine's submit), no index


class IndexReply(msgspec.Struct, frozen=True):
    error: str = ""  # the check refused the constraint (a ValueError's message)
    marked: bool = False
    index: bytes = b""  # outlines-core's serialised Index


class GrammarTimeout(ValueError):
    """A grammar did not compile within the limit (a 4xx: the request asked too much)."""


def vocabulary_spec(table: TokenTable) -> VocabularySpec:
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, data in enumerate(table.token_bytes):
        if data is not None:
            by_bytes.setdefault(data, []).append(token_id)
    from radixrt.runtime.constrained.grammar import end_marker_token

    marker = end_marker_token(table)
    return VocabularySpec(table.eos_token_id, sorted(by_bytes.items()),
                          -1 if marker is None else marker)


class IndexProcess:
    """One child that builds outlines-core indexes, one job at a time (started on first use,
    replaced after a timeout)."""

    def __init__(self, spec: VocabularySpec) -> None:
        self._spec = spec
        self._proc: HelperProcess | None = None
        self._conn: Connection | None = None
        self._decode = msgspec.msgpack.Decoder(IndexReply)

    def build(self, kind: str, pattern: str | tuple[str, ...], timeout_s: float,
              check_only: bool = False) -> IndexReply:
        """Check and index a constraint (check_only: check it); GrammarTimeout past timeout_s
        (the child is killed)."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None
        value = list(pattern) if isinstance(pattern, tuple) else pattern
        self._conn.send_bytes(msgspec.msgpack.encode(IndexJob(kind, value, check_only)))
        if not self._conn.poll(timeout_s):
            self.close()
            raise GrammarTimeout(f"the {kind} did not compile within the grammar compile "
                                 f"timeout ({timeout_s:g} s, --grammar-compile-timeout): "
                                 "simplify it, or ask the operator for a longer limit")
        try:
            return self._decode.decode(self._conn.recv_bytes())
        except EOFError:  # the child died (out of memory, say)
            self.close()
            raise ValueError(f"the {kind} could not be compiled: its compile process "
                             "exited") from None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        self._proc = HelperProcess(serve_index, IndexChildArgs(theirs.fileno(), self._spec),
                                   name="radixrt-grammar", pass_fds=(theirs.fileno(),))
        try:
            self._proc.start()
        finally:
            theirs.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError("the grammar compile process did not start")
        self._conn.recv_bytes()  # ready

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


def build_index(constraint: tuple[str, Any], vocabulary: Any, has_marker: bool,
                check_only: bool) -> IndexReply:
    """Check a constraint and (unless check_only) index it over the vocabulary."""
    from outlines_core import Index, Vocabulary

    from radixrt.runtime.constrained.outlines_regex import index_bytes, plan_regex

    byte_vocab = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    try:
        regex, marked = plan_regex(constraint, byte_vocab, has_marker)
        data = b"" if check_only else index_bytes(Index(regex, vocabulary))
    except (ValueError, RuntimeError) as exc:  # the check's, or the vocabulary cannot write it
        return IndexReply(error=str(exc))
    return IndexReply(marked=marked, index=data)


def serve_index(args: IndexChildArgs) -> None:
    """The child: build indexes until the parent closes its end."""
    from outlines_core import Vocabulary

    conn = Connection(args.channel_fd)
    spec = args.vocabulary
    vocabulary = Vocabulary(spec.eos_token_id, {data: ids for data, ids in spec.entries})
    decode = msgspec.msgpack.Decoder(IndexJob)
    conn.send_bytes(b"ready")
    while True:
        try:
            job = decode.decode(conn.recv_bytes())
        except EOFError:
            return
        pattern = tuple(job.pattern) if isinstance(job.pattern, list) else job.pattern
        reply = build_index((job.kind, pattern), vocabulary, spec.marker_token >= 0,
                            job.check_only)
        conn.send_bytes(msgspec.msgpack.encode(reply))
