"""The worker's lower KV tiers: a bounded host buffer and a bounded disk file, and the one way
pages move between them and the device pool (``PageMove``, applied in the order planned).

The scheduler decides every move (kv_manager.py); the worker only copies. Host pages live in one
preallocated buffer laid out like the device pool ([parts, num_layers, slots, kv_heads, head_dim]:
K and V, or MLA's one latent);
disk pages in this rank's file of the disk tier (disk_format.py: data first, then its record, so
a torn write never reads back as KV). The disk directory is created 0700 and locked, so two
servers never share it; its file is preallocated to its bound and never grows past it. Disk
writes run on a writer thread, off the step's critical path (a read of a page waits for its
write).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import Tensor

from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.messages import DEVICE_TIER, DISK_TIER, HOST_TIER, PageMove
from radixrt.runtime.worker.disk_format import (
    FINGERPRINT_BYTES,
    Geometry,
    chain_digest,
    namespace_digest,
    pack_record,
    rank_file,
    read_header,
    read_namespaces,
    write_namespaces,
)

# namespaces (cache_salt values) a disk tier restores at most: clients choose them
MAX_DISK_NAMESPACES = 4096
# disk_cache_dir without disk_cache_tokens: the disk tier takes this share of its folder's free
# space (its own file from an earlier run counted as free, so a warm restart keeps its size), at
# most DISK_TIER_AUTO_MAX_BYTES on one machine, shared by the machine's ranks
DISK_TIER_FREE_FRACTION = 0.1
DISK_TIER_AUTO_MAX_BYTES = 16 << 30


def model_fingerprint(model_path: str, gguf_file: str | None, dummy: bool) -> bytes:
    """What identifies the weights: the model files' names, sizes and modification times (a
    replaced file changes it). Random (dummy) weights never match anything."""
    h = hashlib.sha256()
    if dummy:
        h.update(os.urandom(16))
    names = [gguf_file] if gguf_file else sorted(os.listdir(model_path))
    for name in names:
        path = os.path.join(model_path, name)
        info = os.stat(path)
        if stat.S_ISREG(info.st_mode):
            h.update(f"{name}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return h.digest()


def prepare_directory(directory: str) -> None:
    """Create the disk tier's directory 0700 (an existing one of ours is set to 0700; one that is
    not ours is refused)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise OSError(f"disk_cache_dir={directory!r}: {exc.strerror or exc}: give a directory "
                      "this server can create and write") from None
    info = os.stat(directory)
    if info.st_uid != os.getuid():
        raise PermissionError(f"disk_cache_dir={directory!r} belongs to another user: "
                              "use a directory of your own")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)


def auto_disk_pages(directory: str, rank: int, local_ranks: int, page_size: int,
                    page_bytes: int) -> int:
    """The disk tier's pages in this rank's file when only its directory was given: a share
    of the free space (DISK_TIER_FREE_FRACTION, at most DISK_TIER_AUTO_MAX_BYTES, split between
    the machine's local_ranks) where the directory is or will be. ValueError when that share
    holds no page."""
    existing = directory
    while not os.path.exists(existing):  # the folder may not be there yet: its nearest parent
        parent = os.path.dirname(existing) or "."
        if parent == existing:
            break
        existing = parent
    info = os.statvfs(existing)
    own = rank_file(directory, rank)
    free = info.f_bavail * info.f_frsize / local_ranks + (
        os.path.getsize(own) if os.path.exists(own) else 0)
    budget = min(DISK_TIER_FREE_FRACTION * free, DISK_TIER_AUTO_MAX_BYTES / local_ranks)
    pages = int(budget // (page_bytes + Geometry(page_size, page_bytes, 1).record_bytes))
    while pages and Geometry(page_size, page_bytes, pages).file_bytes > budget:
        pages -= 1  # the records' block rounding
    if not pages:
        raise ValueError(f"disk_cache_dir={directory!r}: {DISK_TIER_FREE_FRACTION:.0%} of its "
                         f"free space ({free / (1 << 20):.1f} MiB) holds no KV page of "
                         f"{page_bytes} bytes: free some space, or give disk_cache_tokens")
    return pages


class DiskFile:
    """This rank's file of the disk tier, open and locked for the server's life."""

    def __init__(self, directory: str, rank: int, geometry: Geometry, fingerprint: bytes,
                 write_names: bool) -> None:
        prepare_directory(directory)
        self.directory = directory
        self.geometry = geometry
        self.write_names = write_names  # rank 0 keeps the namespace list
        self.names = set(read_namespaces(directory).values())
        path = rank_file(directory, rank)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise RuntimeError(f"disk_cache_dir={directory!r} is in use by another server: "
                               "give each server its own directory") from None
        head = read_header(self.fd)
        if head != (geometry, fingerprint):  # another model, shape or size: start empty
            try:
                self._create(fingerprint)
            except OSError:
                self.close()
                raise

    def _create(self, fingerprint: bytes) -> None:
        """An empty file of the tier's full size: checked against the free space first, and
        given back whole if the allocation fails part way."""
        geo = self.geometry
        os.ftruncate(self.fd, 0)
        info = os.statvfs(self.directory)
        free = info.f_bavail * info.f_frsize
        if geo.file_bytes > free:
            raise OSError(f"disk_cache_dir={self.directory!r}: the disk tier needs "
                          f"{geo.file_bytes} bytes, {free} are free: lower disk_cache_tokens")
        try:
            os.posix_fallocate(self.fd, 0, geo.file_bytes)
        except OSError as exc:
            os.ftruncate(self.fd, 0)
            raise OSError(f"disk_cache_dir={self.directory!r}: the disk tier needs "
                          f"{geo.file_bytes} bytes ({exc.strerror}): lower "
                          "disk_cache_tokens") from None
        os.pwrite(self.fd, geo.header(fingerprint), 0)

    def write(self, page: int, data: bytes, namespace: str | None, parent: bytes,
              tokens: list[int]) -> bytes:
        """Write a page, data first, then its record; returns the page's digest."""
        geo = self.geometry
        if len(data) != geo.page_bytes:
            raise ValueError(f"disk page of {len(data)} bytes, the file's are {geo.page_bytes}")
        if (self.write_names and namespace not in self.names
                and len(self.names) < MAX_DISK_NAMESPACES):  # past it: written, not restored
            self.names.add(namespace)
            write_namespaces(self.directory, sorted(self.names, key=lambda n: (n is not None,
                                                                              n or "")))
        record = pack_record(namespace_digest(namespace), parent, tokens, data)
        for blob, offset in ((data, geo.data_offset_of(page)), (record, geo.record_offset(page))):
            if os.pwrite(self.fd, blob, offset) != len(blob):
                raise OSError(f"a short write to the disk KV tier ({self.directory})")
        return chain_digest(parent, tokens)

    def read(self, page: int) -> bytes:
        geo = self.geometry
        return os.pread(self.fd, geo.page_bytes, geo.data_offset_of(page))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


class DiskWriter:
    """Writes to the disk tier off the step's thread: one writer thread, in submission order
    (a page's data before its record, a page rewritten after its earlier write). A read of a
    page waits for its pending write; close() waits for all of them. A failed write raises at
    the next wait (the worker fails the step: fail-stop)."""

    def __init__(self, disk: DiskFile) -> None:
        self.disk = disk
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixrt-disk")
        self._lock = threading.Lock()  # _pending is changed by both threads
        self._pending: dict[int, Future[None]] = {}  # page -> its latest write
        self._error: BaseException | None = None  # the first failed write

    def write(self, move: PageMove, data: Tensor, page_size: int) -> None:
        """Queue the pages of a move to the disk tier; `data` is the move's own copy."""
        self._raise()
        future = self._pool.submit(self._write, move, data, page_size)
        with self._lock:
            for page in move.dst:
                self._pending[page] = future
        future.add_done_callback(lambda done: self._done(move.dst, done))

    def _done(self, pages: list[int], done: Future[None]) -> None:
        error = done.exception()
        with self._lock:
            if error is not None:
                self._error = self._error or error
                return  # kept pending: a read of these pages raises
            for page in pages:
                if self._pending.get(page) is done:
                    del self._pending[page]

    def _settle(self, futures: Iterable[Future[None]]) -> None:
        """Wait for these writes; a failed one (or any earlier) raises."""
        for future in futures:
            error = future.exception()
            if error is not None:
                self._error = self._error or error
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"a write to the disk KV tier failed: {self._error}") \
                from self._error

    def _write(self, move: PageMove, data: Tensor, page_size: int) -> None:
        parent = move.prefix
        for i, page in enumerate(move.dst):
            chunk = data[:, :, i * page_size : (i + 1) * page_size].contiguous()
            raw = chunk.view(torch.uint8).numpy().tobytes()
            parent = self.disk.write(page, raw, move.namespace, parent,
                                     move.tokens[i * page_size : (i + 1) * page_size])

    def wait(self, pages: list[int]) -> None:
        with self._lock:
            futures = {id(f): f for p in pages if (f := self._pending.get(p)) is not None}
        self._settle(futures.values())

    def drain(self) -> None:
        with self._lock:
            futures = {id(f): f for f in self._pending.values()}
        self._settle(futures.values())

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        try:
            self.drain()  # re-raises a failed write
        finally:
            self.disk.close()


class KVTiers:
    """The host buffer and the disk file beside the device pool, and the moves between them."""

    def __init__(self, kv_cache: KVCache, page_size: int, host_pages: int,
                 disk: DiskFile | None) -> None:
        self.kv = kv_cache
        self.page_size = page_size
        shape = (kv_cache.parts, kv_cache.num_layers, host_pages * page_size,
                 kv_cache.num_kv_heads, kv_cache.head_dim)
        pin = kv_cache.device.type == "cuda"
        self.host = torch.empty(shape if host_pages else (0,), dtype=kv_cache.dtype,
                                pin_memory=pin)  # [parts, num_layers, host slots, kv_heads, dim]
        self.disk = disk
        self.writer = DiskWriter(disk) if disk is not None else None
        self.seconds = 0.0  # spent applying moves on the step's thread, since take_seconds()

    @property
    def host_bytes(self) -> int:
        return self.host.numel() * self.host.element_size()

    def _slots(self, pages: list[int]) -> Tensor:
        ps = self.page_size
        return torch.tensor([p * ps + i for p in pages for i in range(ps)], dtype=torch.int64)

    def _read(self, tier: int, pages: list[int]) -> Tensor:
        """[parts, num_layers, len(pages) * page_size, kv_heads, head_dim] on the CPU."""
        if tier == DEVICE_TIER:
            return self.kv.read_slots(self._slots(pages))
        if tier == HOST_TIER:
            return self.host[:, :, self._slots(pages)]
        assert self.disk is not None and self.writer is not None
        self.writer.wait(pages)
        kv = self.kv
        shape = (kv.parts, kv.num_layers, self.page_size, kv.num_kv_heads, kv.head_dim)
        parts = [torch.frombuffer(bytearray(self.disk.read(p)), dtype=torch.uint8)
                 .view(kv.dtype).reshape(shape) for p in pages]
        return torch.cat(parts, dim=2)

    def _write(self, move: PageMove, data: Tensor) -> None:
        if move.dst_tier == DEVICE_TIER:
            self.kv.write_slots(self._slots(move.dst), data)
        elif move.dst_tier == HOST_TIER:
            self.host[:, :, self._slots(move.dst)] = data
        else:
            assert self.writer is not None
            self.writer.write(move, data, self.page_size)  # `data` is a copy (_read's)

    def apply(self, moves: list[PageMove]) -> None:
        """Apply a plan's moves in order (a page freed by one may be written by a later one)."""
        start = time.perf_counter()
        for move in moves:
            if len(move.src) != len(move.dst):
                raise ValueError(f"a move of {len(move.src)} pages to {len(move.dst)}")
            if move.dst_tier == DISK_TIER and len(move.tokens) != len(move.dst) * self.page_size:
                raise ValueError("a move to the disk tier without its pages' tokens")
            self._write(move, self._read(move.src_tier, move.src))
        self.seconds += time.perf_counter() - start

    def take_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def flush(self) -> None:
        """Wait for the disk tier's pending writes."""
        if self.writer is not None:
            self.writer.drain()

    def close(self) -> None:
        """Wait for the disk tier's pending writes and close its file."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def fingerprint(model: bytes, dtype: torch.dtype, kv: KVCache, page_size: int, rank: int,
                num_ranks: int) -> bytes:
    """What a disk page's KV depends on beside its tokens."""
    h = hashlib.sha256(model)
    latent = "latent|" if kv.parts == 1 else ""  # (K/V pools' files keep their fingerprint)
    h.update(f"{dtype}|{latent}{kv.num_layers}|{kv.num_kv_heads}|{kv.head_dim}|{page_size}|"
             f"{rank}|{num_ranks}".encode())
    return h.digest()[:FINGERPRINT_BYTES]
