"""Tensor-parallel ranks in one test process: threads of one real gloo group (the layers'
collectives run for real), their results by rank."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch

from radixrt.runtime.distributed.group import TPGroup, bind_listener

T = TypeVar("T")
COLLECTIVE_TIMEOUT_S = 30.0  # a rank waiting on a peer that died raises after this
JOIN_S = 60.0  # the test fails if a rank thread is still running after this


def run_ranks(size: int, fn: Callable[[TPGroup], T]) -> list[T]:
    """fn(group) on `size` rank threads of one real gloo group; their results, by rank. The first
    exception raised on any rank is re-raised here."""
    listen = bind_listener("127.0.0.1", 0)
    addr = f"127.0.0.1:{listen.getsockname()[1]}"
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def rank_fn(rank: int) -> None:
        try:
            group = TPGroup.join(rank, size, addr, "gloo", COLLECTIVE_TIMEOUT_S,
                                 listen if rank == 0 else None)
            assert (group.rank, group.size) == (rank, size)
            with torch.no_grad():  # per thread: the layers' forward outside the model's
                results[rank] = fn(group)
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_fn, args=(r,), name=f"tp-rank-{r}", daemon=True)
               for r in range(size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_S)
    finally:
        listen.close()
    if errors:
        raise errors[0]
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        pytest.fail(f"rank threads {stuck} did not finish within {JOIN_S} s")
    return results
