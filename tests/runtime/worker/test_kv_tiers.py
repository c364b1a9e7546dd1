"""The worker's KV tiers: pages moved device -> host -> disk -> device keep their K/V exactly; the
disk directory is made 0700 and locked to one server; a file of another model (fingerprint) or
size is recreated empty; a bound the disk cannot hold is refused with a message."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.messages import DEVICE_TIER, DISK_TIER, HOST_TIER, PageMove
from radixrt.runtime.worker.disk_format import Geometry, prefix_digest, scan_file, write_namespaces
from radixrt.runtime.worker.kv_tiers import (
    DISK_TIER_AUTO_MAX_BYTES,
    DISK_TIER_FREE_FRACTION,
    DiskFile,
    KVTiers,
    auto_disk_pages,
    model_fingerprint,
)

PS = 2


def tiers(tmp_path, dtype: torch.dtype = torch.float32,
          parts: int = 2) -> tuple[KVTiers, KVCache]:
    """parts 1: a latent pool (one row per token and layer, multi-head latent attention)."""
    kv = KVCache(num_layers=3, num_slots=8 * PS, num_kv_heads=2 if parts == 2 else 1,
                 head_dim=4 if parts == 2 else 12, dtype=dtype, device="cpu", parts=parts)
    kv.buffer.copy_(torch.randn(kv.buffer.shape).to(dtype))
    geo = Geometry(PS, kv.bytes_per_token() * PS, 10)
    disk = DiskFile(str(tmp_path / "kv"), 0, geo, b"m" * 32, write_names=True)
    return KVTiers(kv, PS, host_pages=6, disk=disk), kv


def page_kv(kv: KVCache, page: int) -> torch.Tensor:
    return kv.buffer[:, :, page * PS : (page + 1) * PS].clone()


@pytest.mark.parametrize(("dtype", "parts"), [(torch.float32, 2), (torch.bfloat16, 2),
                                              (torch.bfloat16, 1)])
def test_a_round_trip_through_every_tier_keeps_the_kv(tmp_path, dtype: torch.dtype,
                                                      parts: int) -> None:
    t, kv = tiers(tmp_path, dtype, parts)
    before = [page_kv(kv, p) for p in (1, 2)]
    tokens = [11, 12, 13, 14]
    t.apply([PageMove(DEVICE_TIER, HOST_TIER, [1, 2], [4, 0]),
             PageMove(HOST_TIER, DISK_TIER, [4, 0], [7, 3], namespace="salt",
                      prefix=prefix_digest("salt", [], PS), tokens=tokens),
             PageMove(DISK_TIER, DEVICE_TIER, [7, 3], [5, 6])])
    assert torch.equal(page_kv(kv, 5), before[0]) and torch.equal(page_kv(kv, 6), before[1])
    assert t.take_seconds() > 0 and t.take_seconds() == 0
    t.close()  # the disk writer's pending writes are done
    records = scan_file(os.path.join(tmp_path, "kv", "rank0.kv"))
    assert sorted(records) == [3, 7] and records[7].tokens == (11, 12)
    assert records[3].parent == records[7].digest  # the second page chains from the first


def test_a_failed_disk_write_fails_the_next_read_and_the_close(tmp_path, monkeypatch) -> None:
    t, _ = tiers(tmp_path)

    def broken(*_args: object) -> bytes:
        raise OSError("no space left on device")

    monkeypatch.setattr(t.disk, "write", broken)
    t.apply([PageMove(DEVICE_TIER, DISK_TIER, [1], [4], prefix=prefix_digest(None, [], PS),
                      tokens=[1, 2])])
    with pytest.raises(RuntimeError, match="no space left"):
        t.apply([PageMove(DISK_TIER, DEVICE_TIER, [4], [2])])
    with pytest.raises(RuntimeError, match="no space left"):
        t.close()


def test_a_move_to_disk_needs_its_tokens(tmp_path) -> None:
    t, _ = tiers(tmp_path)
    with pytest.raises(ValueError, match="tokens"):
        t.apply([PageMove(DEVICE_TIER, DISK_TIER, [1], [1])])
    t.close()


def test_the_directory_is_private_locked_and_recreated_for_another_model(tmp_path) -> None:
    d = str(tmp_path / "kv")
    os.makedirs(d, mode=0o755)
    geo = Geometry(PS, 64, 4)
    disk = DiskFile(d, 0, geo, b"a" * 32, write_names=True)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    with pytest.raises(RuntimeError, match="in use by another server"):
        DiskFile(d, 0, geo, b"a" * 32, write_names=True)
    disk.write(1, b"\x01" * 64, None, prefix_digest(None, [], PS), [1, 2])
    disk.close()
    write_namespaces(d, [None])
    path = os.path.join(d, "rank0.kv")
    assert sorted(scan_file(path)) == [1]
    DiskFile(d, 0, geo, b"a" * 32, write_names=True).close()  # same model: kept
    assert sorted(scan_file(path)) == [1]
    DiskFile(d, 0, geo, b"b" * 32, write_names=True).close()  # another model: empty
    assert scan_file(path) == {}
    assert os.path.getsize(path) == geo.file_bytes  # preallocated to its bound


def test_a_bound_the_disk_cannot_hold_is_refused(tmp_path) -> None:
    free = os.statvfs(tmp_path)
    huge = Geometry(PS, 1 << 30, (free.f_bavail * free.f_frsize >> 30) + 8)
    with pytest.raises(OSError, match="lower disk_cache_tokens"):
        DiskFile(str(tmp_path / "kv"), 0, huge, b"a" * 32, write_names=True)


def test_a_directory_alone_sizes_the_tier_from_its_free_space_and_keeps_it(tmp_path) -> None:
    """A share of the free space (split between the machine's ranks, capped), measured where
    the folder will be; the file an earlier run left counts as free, so a warm restart finds a
    file of its own size and keeps what it holds."""
    d = str(tmp_path / "not" / "yet")
    page_bytes = 1 << 20
    info = os.statvfs(tmp_path)
    free = info.f_bavail * info.f_frsize
    pages = auto_disk_pages(d, 0, 1, PS, page_bytes)
    budget = min(DISK_TIER_FREE_FRACTION * free, DISK_TIER_AUTO_MAX_BYTES)
    assert 0 < Geometry(PS, page_bytes, pages).file_bytes <= budget
    assert Geometry(PS, page_bytes, pages + 2).file_bytes > budget * 0.99
    assert auto_disk_pages(d, 1, 2, PS, page_bytes) <= pages // 2 + 1  # two ranks share it
    small = auto_disk_pages(d, 0, 1, PS, 4096)  # a small page: many more of them
    try:
        DiskFile(d, 0, Geometry(PS, 4096, small), b"a" * 32, write_names=True).close()
        assert abs(auto_disk_pages(d, 0, 1, PS, 4096) - small) <= small // 1000 + 1
    finally:
        shutil.rmtree(d)  # gigabytes, preallocated


def test_a_free_space_that_holds_no_page_is_refused(tmp_path) -> None:
    free = os.statvfs(tmp_path)
    huge = int(free.f_bavail * free.f_frsize * DISK_TIER_FREE_FRACTION) + (1 << 20)
    with pytest.raises(ValueError, match="holds no KV page.*disk_cache_tokens"):
        auto_disk_pages(str(tmp_path / "kv"), 0, 1, 1, huge)


def test_the_model_fingerprint_follows_the_files(tmp_path) -> None:
    (tmp_path / "w.gguf").write_bytes(b"weights")
    first = model_fingerprint(str(tmp_path), "w.gguf", dummy=False)
    assert model_fingerprint(str(tmp_path), "w.gguf", dummy=False) == first
    (tmp_path / "w.gguf").write_bytes(b"other weights")
    assert model_fingerprint(str(tmp_path), "w.gguf", dummy=False) != first
    assert model_fingerprint(str(tmp_path), "w.gguf", dummy=True) != model_fingerprint(
        str(tmp_path), "w.gguf", dummy=True)
