"""The disk tier's file format: one preallocated file per tensor-parallel rank, whose pages hold KV
and whose records say which tokens each page holds. Pure bytes (no tensors), so the scheduler
reads a warm restart's index from it without the worker.

Layout of ``rank{R}.kv`` (little-endian):

    header   HEADER_BYTES: magic, version, page_size, page_bytes, num_pages, record_bytes, and a
             32-byte fingerprint of what the KV depends on (model files, dtype, KV shape, page
             size, rank); a file whose header differs is recreated empty, never read
    records  num_pages fixed-size records (RECORD), padded to a block
    data     num_pages pages of page_bytes each

A record names its page's tokens by a digest chain: ``digest = H(parent digest, the page's
tokens)``, the first page's parent being its namespace's digest (``namespace_digest``), so one
record is enough to place a page in the tree once its parent is placed. It also holds the CRC32 of
its page's data and of itself. A page is written data first, record second; a write torn by a
kill (or a record left by the page's previous occupant) fails a CRC and is skipped on restart;
the pages below it wait as orphans until their head is computed again (scheduler/tier_mover.py).
Namespaces (``cache_salt``) are kept in ``namespaces.msgpack`` next to the files (written then
renamed).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b

import msgspec

FORMAT_MAGIC = b"RXKV"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
BLOCK_BYTES = 4096
DIGEST_BYTES = 16
FINGERPRINT_BYTES = 32
RECORD_MAGIC = b"RXPG"
NAMESPACES_FILE = "namespaces.msgpack"
HEADER = struct.Struct(f"<4sIIQQI{FINGERPRINT_BYTES}s")  # magic, version, page_size,
# page_bytes, num_pages, record_bytes, fingerprint
RECORD_HEAD = struct.Struct(f"<4sII{DIGEST_BYTES}s{DIGEST_BYTES}s{DIGEST_BYTES}s")  # magic,
# record crc (of all after it), data crc, namespace digest, parent digest, digest; then tokens


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.kv")


def namespace_digest(extra_key: str | None) -> bytes:
    """The digest a namespace's first pages chain from."""
    name = b"\x00none" if extra_key is None else b"\x01" + extra_key.encode()
    return blake2b(b"radixrt-namespace" + name, digest_size=DIGEST_BYTES).digest()


def chain_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of a page holding `tokens` after the tokens `parent` names."""
    return blake2b(parent + token_bytes(tokens), digest_size=DIGEST_BYTES).digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as the records store them: little-endian uint32s."""
    return struct.pack(f"<{len(tokens)}I", *tokens)


def prefix_digest(extra_key: str | None, tokens: Sequence[int], page_size: int) -> bytes:
    """The digest after `tokens` (whole pages) of namespace `extra_key`."""
    digest = namespace_digest(extra_key)
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        digest = chain_digest(digest, tokens[i : i + page_size])
    return digest


def record_bytes(page_size: int) -> int:
    return RECORD_HEAD.size + 4 * page_size


@dataclass(frozen=True)
class Geometry:
    """Where things are in a rank's file."""

    page_size: int
    page_bytes: int
    num_pages: int

    @property
    def record_bytes(self) -> int:
        return record_bytes(self.page_size)

    @property
    def data_offset(self) -> int:
        records = self.num_pages * self.record_bytes
        return HEADER_BYTES + -(-records // BLOCK_BYTES) * BLOCK_BYTES

    @property
    def file_bytes(self) -> int:
        return self.data_offset + self.num_pages * self.page_bytes

    def record_offset(self, page: int) -> int:
        return HEADER_BYTES + page * self.record_bytes

    def data_offset_of(self, page: int) -> int:
        return self.data_offset + page * self.page_bytes

    def header(self, fingerprint: bytes) -> bytes:
        return HEADER.pack(FORMAT_MAGIC, FORMAT_VERSION, self.page_size, self.page_bytes,
                           self.num_pages, self.record_bytes, fingerprint)


def pack_record(namespace: bytes, parent: bytes, tokens: Sequence[int], data: bytes) -> bytes:
    digest = chain_digest(parent, tokens)
    tail = token_bytes(tokens)
    body = struct.pack("<I", zlib.crc32(data)) + namespace + parent + digest + tail
    return RECORD_MAGIC + struct.pack("<I", zlib.crc32(body)) + body


@dataclass(frozen=True)
class PageRecord:
    """A disk page whose record and data checked out."""

    page: int
    namespace: bytes
    parent: bytes
    digest: bytes
    tokens: tuple[int, ...]


def read_header(fd: int) -> tuple[Geometry, bytes] | None:
    """A file's geometry and fingerprint, or None where its header is not this format's."""
    raw = os.pread(fd, HEADER.size, 0)
    if len(raw) != HEADER.size:
        return None
    magic, version, page_size, page_bytes, num_pages, rec_bytes, fingerprint = HEADER.unpack(raw)
    if magic != FORMAT_MAGIC or version != FORMAT_VERSION or page_size < 1:
        return None
    geometry = Geometry(page_size, page_bytes, num_pages)
    if rec_bytes != geometry.record_bytes or os.fstat(fd).st_size < geometry.file_bytes:
        return None
    return geometry, fingerprint


def unpack_record(raw: bytes, page_size: int) -> tuple[bytes, bytes, bytes, int, tuple[int, ...]]:
    """(namespace, parent, digest, data crc, tokens) of a record whose own CRC and chain check
    out; ValueError otherwise."""
    magic, crc, data_crc, namespace, parent, digest = RECORD_HEAD.unpack_from(raw)
    if magic != RECORD_MAGIC or zlib.crc32(raw[8:]) != crc:
        raise ValueError("torn or empty record")
    tokens = struct.unpack_from(f"<{page_size}I", raw, RECORD_HEAD.size)
    if chain_digest(parent, tokens) != digest:
        raise ValueError("record digest does not match its tokens")
    return namespace, parent, digest, data_crc, tokens


def scan_file(path: str) -> dict[int, PageRecord]:
    """Every page of one rank's file whose record and data check out (empty when the file is
    missing or not this format's)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        head = read_header(fd)
        if head is None:
            return {}
        geo = head[0]
        records = os.pread(fd, geo.num_pages * geo.record_bytes, HEADER_BYTES)
        found: dict[int, PageRecord] = {}
        for page in range(geo.num_pages):
            raw = records[page * geo.record_bytes : (page + 1) * geo.record_bytes]
            if raw[:4] != RECORD_MAGIC:
                continue
            try:
                namespace, parent, digest, data_crc, tokens = unpack_record(raw, geo.page_size)
            except ValueError:
                continue
            if zlib.crc32(os.pread(fd, geo.page_bytes, geo.data_offset_of(page))) != data_crc:
                continue  # torn data, or the page's next occupant was being written
            found[page] = PageRecord(page, namespace, parent, digest, tokens)
        return found
    finally:
        os.close(fd)


def read_namespaces(directory: str) -> dict[bytes, str | None]:
    """namespace digest -> extra_key, of the namespaces pages were written in."""
    try:
        with open(os.path.join(directory, NAMESPACES_FILE), "rb") as f:
            names = msgspec.msgpack.decode(f.read(), type=list[str | None])
    except (FileNotFoundError, msgspec.DecodeError):
        return {}
    return {namespace_digest(name): name for name in names}


def write_namespaces(directory: str, names: Sequence[str | None]) -> None:
    """Write then rename: a reader sees the old list or the new, never half of one."""
    path = os.path.join(directory, NAMESPACES_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(msgspec.msgpack.encode(list(names)))
    os.replace(tmp, path)


@dataclass(frozen=True)
class RestoredPrefix:
    """A cached token sequence of the disk tier: its namespace, tokens and disk pages. `parent`:
    empty when the tokens start at the namespace's root; else the digest of the tokens before
    them, whose pages were not on disk (an *orphan*: it is attached under those tokens once a
    request computes them again)."""

    extra_key: str | None
    tokens: list[int]
    pages: list[int]
    parent: bytes = b""


def scan(directory: str, num_ranks: int) -> list[RestoredPrefix]:
    """The prefixes a warm restart restores: pages valid in every rank's file, one prefix per
    chain's end (shared heads repeat; the radix tree holds them once), each from its namespace's
    root or, where the pages above it never reached the disk, from the first page found (an
    orphan, `parent` set). A page found twice (the same digest) is held once; a namespace not
    in the namespace list is never restored."""
    files = [scan_file(rank_file(directory, r)) for r in range(num_ranks)]
    names = read_namespaces(directory)
    by_digest: dict[bytes, PageRecord] = {}
    for page, record in sorted(files[0].items()):
        others = [f.get(page) for f in files[1:]]
        if all(o is not None and o.digest == record.digest for o in others):
            by_digest.setdefault(record.digest, record)
    parents = {r.parent for r in by_digest.values()}
    restored = []
    for digest in by_digest:
        if digest in parents:
            continue  # not a chain's end
        chain: list[PageRecord] = []
        at = digest
        while at in by_digest and len(chain) <= len(by_digest):
            chain.append(by_digest[at])
            at = by_digest[at].parent
        chain.reverse()
        namespace = chain[0].namespace
        if namespace not in names or any(r.namespace != namespace for r in chain):
            continue
        restored.append(RestoredPrefix(names[namespace], [t for r in chain for t in r.tokens],
                                       [r.page for r in chain],
                                       b"" if at == namespace else at))
    return restored
