"""The disk tier's file format: records chain pages to their namespace, a scan keeps only pages
whose record and data check out and whose chain reaches a known namespace, in every rank's file,
and a torn write at any byte never scans as KV."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.worker.disk_format import (
    Geometry,
    chain_digest,
    namespace_digest,
    pack_record,
    prefix_digest,
    rank_file,
    scan,
    scan_file,
    write_namespaces,
)

PS = 2
GEO = Geometry(page_size=PS, page_bytes=24, num_pages=6)


def make_file(directory: str, rank: int, pages: dict[int, tuple[bytes, list[int], bytes]],
              namespace: str | None = None) -> str:
    """A rank file holding `pages`: page -> (parent digest, tokens, data)."""
    path = rank_file(directory, rank)
    with open(path, "wb") as f:
        f.truncate(GEO.file_bytes)
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, GEO.header(b"f" * 32), 0)
    for page, (parent, tokens, data) in pages.items():
        os.pwrite(fd, data, GEO.data_offset_of(page))
        os.pwrite(fd, pack_record(namespace_digest(namespace), parent, tokens, data),
                  GEO.record_offset(page))
    os.close(fd)
    return path


def chain(tokens: list[int], namespace: str | None = None) -> list[tuple[bytes, list[int], bytes]]:
    """The records of `tokens` (whole pages) page by page: (parent, page tokens, data)."""
    out = []
    parent = namespace_digest(namespace)
    for i in range(0, len(tokens), PS):
        page = tokens[i : i + PS]
        out.append((parent, page, bytes([i % 251]) * GEO.page_bytes))
        parent = chain_digest(parent, page)
    return out


def test_digests_chain_page_by_page_and_namespaces_differ() -> None:
    assert prefix_digest(None, [1, 2, 3, 4, 5], 2) == chain_digest(
        chain_digest(namespace_digest(None), [1, 2]), [3, 4])
    assert namespace_digest(None) != namespace_digest("") != namespace_digest("salt")


def test_scan_restores_chains_shares_heads_and_keeps_orphans(tmp_path) -> None:
    d = str(tmp_path)
    a = chain([1, 2, 3, 4, 5, 6])
    b = chain([1, 2, 3, 4, 9, 9])
    orphan = chain([7, 7, 8, 8, 6, 6])[1:]  # the page above it never reached the disk
    make_file(d, 0, {0: a[0], 1: a[1], 2: a[2], 3: b[2], 4: orphan[0], 5: orphan[1]})
    assert scan(d, 1) == []  # no namespace list: nothing is trusted
    write_namespaces(d, [None])
    got = sorted((p.tokens, p.pages, p.parent) for p in scan(d, 1))
    assert got == [([1, 2, 3, 4, 5, 6], [0, 1, 2], b""), ([1, 2, 3, 4, 9, 9], [0, 1, 3], b""),
                   ([8, 8, 6, 6], [4, 5], prefix_digest(None, [7, 7], PS))]


def test_a_page_must_check_out_in_every_rank(tmp_path) -> None:
    d = str(tmp_path)
    a = chain([1, 2, 3, 4])
    make_file(d, 0, {0: a[0], 1: a[1]})
    make_file(d, 1, {0: a[0]})
    write_namespaces(d, [None])
    assert [(p.tokens, p.pages) for p in scan(d, 2)] == [([1, 2], [0])]
    make_file(d, 1, {1: a[1]})  # rank 1 lost the head: nothing is rooted anywhere
    assert [(p.tokens, p.parent) for p in scan(d, 2)] == [([3, 4], prefix_digest(None, [1, 2],
                                                                                   PS))]


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, GEO.page_bytes + 200), junk=st.binary(min_size=1, max_size=8))
def test_a_torn_write_never_scans_as_kv(tmp_path_factory, cut: int, junk: bytes) -> None:
    """Page 1 is rewritten with new tokens and data, data first then record; the writer dies
    after `cut` bytes (junk may follow). The page scans as the old content or the new, or not
    at all, never as a mix."""
    d = str(tmp_path_factory.mktemp("torn"))
    old = chain([1, 2, 3, 4])
    path = make_file(d, 0, {0: old[0], 1: old[1]})
    new_parent, new_tokens = old[1][0], [5, 6]
    new_data = b"\x07" * GEO.page_bytes
    writes = [(GEO.data_offset_of(1), new_data),
              (GEO.record_offset(1), pack_record(namespace_digest(None), new_parent,
                                                 new_tokens, new_data))]
    fd = os.open(path, os.O_RDWR)
    left = cut
    for offset, data in writes:
        part = data[:left]
        os.pwrite(fd, part + (junk if len(part) < len(data) else b"")[: len(data) - len(part)],
                  offset)
        left -= len(part)
        if left <= 0:
            break
    os.close(fd)
    found = scan_file(path)
    assert found[0].tokens == (1, 2)
    if 1 in found:
        assert found[1].tokens in ((3, 4), (5, 6))
        with open(path, "rb") as f:
            f.seek(GEO.data_offset_of(1))
            data = f.read(GEO.page_bytes)
        assert data == (old[1][2] if found[1].tokens == (3, 4) else new_data)
