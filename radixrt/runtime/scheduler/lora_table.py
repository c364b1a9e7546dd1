"""The scheduler's LoRA adapters: the names requests may use, each an adapter checked against
the model (models/lora_format.py) and known by its files' digest; what the worker must be told
(a new adapter before the first request that uses it; an adapter no request uses any more,
once unloaded); and which adapters a step may mix (--max-loras-per-batch).

A request's KV under an adapter lives in the adapter's namespace of the radix tree
(lora_format.lora_namespace: the digest, and the request's cache_salt inside it), so a prefix is
reused only under the same adapter, and a name loaded again with other files never meets the
old files' KV. Unloading a name refuses new requests at once; the requests already queued or
running under it finish with it; then the worker forgets the adapter and the tree drops its
cached KV (what a pin still locks stays until the pin is released, then ages out).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from radixrt.runtime.lora_messages import LoraAdapter, LoraModuleShapes
from radixrt.runtime.models.lora_format import LoraSpec, adapter_key, lora_namespace, read_spec


@dataclass(frozen=True)
class LoadedLora:
    name: str
    spec: LoraSpec

    @property
    def key(self) -> str:
        return adapter_key(self.spec.digest)

    def describe(self) -> dict:
        return {"name": self.name, "path": self.spec.path, "rank": self.spec.rank,
                "modules": sorted(self.spec.modules), "digest": self.spec.digest}


class LoraTable:
    def __init__(self, shapes: LoraModuleShapes | None, max_rank: int, max_per_batch: int,
                 max_adapters: int) -> None:
        self.shapes = shapes
        self.max_rank = max_rank
        self.max_per_batch = max_per_batch
        self.max_adapters = max_adapters
        self.by_name: dict[str, LoadedLora] = {}
        self.known: set[str] = set()  # keys the worker was told of and not told to forget
        self.to_load: list[LoraAdapter] = []
        self.dropped: set[str] = set()  # keys unloaded, to forget once no request uses them

    @property
    def enabled(self) -> bool:
        return self.shapes is not None

    def load(self, name: str, path: str) -> LoadedLora:
        """Check the adapter in `path` and serve it as `name`; ValueError naming what is wrong
        (nothing changes then)."""
        if self.shapes is None:
            raise ValueError("this server serves no LoRA adapters: start it with --lora-paths "
                             "or --enable-lora")
        if name in self.by_name:
            raise ValueError(f"a LoRA adapter named {name!r} is loaded already; unload it first")
        if len(self.by_name) >= self.max_adapters:
            raise ValueError(f"{self.max_adapters} LoRA adapters are loaded, the most one "
                             "server holds; unload one first")
        loaded = LoadedLora(name, read_spec(path, self.shapes, self.max_rank))
        self.by_name[name] = loaded
        self.dropped.discard(loaded.key)
        if loaded.key not in self.known:
            self.known.add(loaded.key)
            self.to_load.append(LoraAdapter(loaded.key, loaded.spec.path))
        return loaded

    def unload(self, name: str) -> LoadedLora:
        """Stop serving `name` (KeyError: not loaded)."""
        if name not in self.by_name:
            raise KeyError(f"no LoRA adapter named {name!r} is loaded")
        loaded = self.by_name.pop(name)
        if all(other.key != loaded.key for other in self.by_name.values()):
            self.dropped.add(loaded.key)
        return loaded

    def resolve(self, name: str, cache_salt: str | None) -> tuple[str, str]:
        """The worker's key of adapter `name` and the radix namespace of a request under it
        with `cache_salt`; ValueError when no adapter has that name."""
        loaded = self.by_name.get(name)
        if loaded is None:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {known})")
        return loaded.key, lora_namespace(loaded.spec.digest, cache_salt)

    def take_loads(self) -> list[LoraAdapter]:
        loads, self.to_load = self.to_load, []
        return loads

    def take_unloads(self, in_use: Iterable[str | None]) -> list[str]:
        """Unloaded keys no request in `in_use` (every request's key) uses any more: the
        worker forgets them (and the caller drops their KV)."""
        if not self.dropped:
            return []
        used = set(in_use)
        gone = sorted(k for k in self.dropped if k not in used)
        self.dropped.difference_update(gone)
        self.known.difference_update(gone)
        return gone

    def fits(self, running: Iterable[str | None], key: str | None) -> bool:
        """May a request under `key` join requests under `running` in one step?"""
        if key is None:
            return True
        adapters = Counter(k for k in running if k is not None)
        return key in adapters or len(adapters) < self.max_per_batch

    def listing(self) -> list[dict]:
        return [loaded.describe() for loaded in self.by_name.values()]
