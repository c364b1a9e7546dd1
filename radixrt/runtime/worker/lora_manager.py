"""The worker's LoRA adapters: which it may be asked for (registered by the plans), which it
holds in host memory (at most --max-loaded-loras, least recently used first out; the rest are
read again from their folders when a request needs them), and which sit in the model's slots
(--max-loras-per-batch of them: every adapter a batch uses has one; a slot the batch does not
use is reused, least recently used first).

Every tensor-parallel rank runs the same plans through the same manager, so the ranks agree
on every slot without a word between them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from radixrt.runtime.forward.lora_batch import NO_ADAPTER, LoraBatch
from radixrt.runtime.lora_messages import LoraAdapter, LoraModuleShapes
from radixrt.runtime.models.lora_format import read_spec
from radixrt.runtime.models.lora_layer import LoraSlots
from radixrt.runtime.models.lora_weights import LoraWeights, adapted_modules, load_lora


class LoraManager:
    def __init__(self, model: torch.nn.Module, shapes: LoraModuleShapes, num_slots: int,
                 max_rank: int, max_loaded: int | None) -> None:
        param = next(model.parameters())
        self.shapes = shapes
        self.max_rank = max_rank
        self.max_loaded = max_loaded
        self.modules = adapted_modules(model)
        for (_, name), module in self.modules.items():
            rank = max_rank * len(shapes.parts[name])  # a fused module's parts stack
            module.lora = LoraSlots(num_slots, rank, module.in_features,  # type: ignore[union-attr]
                                    module.out_features, param.dtype, param.device)
        self.paths: dict[str, str] = {}  # registered adapters: key -> folder
        self.host: OrderedDict[str, LoraWeights] = OrderedDict()  # least recently used first
        self.slot_key: list[str | None] = [None] * num_slots
        self.slot_age: list[int] = [0] * num_slots  # the batch that last used each slot
        self.batches = 0
        self.loads = 0  # adapters read from their folders

    @property
    def num_slots(self) -> int:
        return len(self.slot_key)

    def register(self, adapters: Sequence[LoraAdapter]) -> None:
        """Adapters requests may name from now on; read at once while host memory has room
        (--max-loaded-loras), so that a folder removed after its load costs nothing."""
        for adapter in adapters:
            self.paths[adapter.key] = adapter.path
            if self.max_loaded is None or len(self.host) < self.max_loaded:
                self._weights(adapter.key)

    def forget(self, keys: Sequence[str]) -> None:
        """Adapters no request uses any more: out of host memory and their slots."""
        for key in keys:
            self.paths.pop(key, None)
            self.host.pop(key, None)
            for slot, held in enumerate(self.slot_key):
                if held == key:
                    self.slot_key[slot] = None
                    self._fill(slot, None)

    def batch(self, entry_keys: Sequence[str | None], extend_lens: Sequence[int],
              device: torch.device) -> LoraBatch | None:
        """The LoraBatch of a forward pass whose entries run under `entry_keys` (None: the base
        model), loading adapters into slots as needed."""
        wanted = {k for k in entry_keys if k is not None}
        if not wanted:
            return None
        if len(wanted) > self.num_slots:
            raise RuntimeError(f"a batch uses {len(wanted)} LoRA adapters; the worker has "
                               f"{self.num_slots} slots (--max-loras-per-batch)")
        self.batches += 1
        slot_of = {key: slot for slot, key in enumerate(self.slot_key) if key in wanted}
        for key in sorted(wanted - set(slot_of)):
            free = [s for s in range(self.num_slots) if self.slot_key[s] not in wanted]
            slot = min(free, key=lambda s: (self.slot_key[s] is not None, self.slot_age[s]))
            self.slot_key[slot] = key
            self._fill(slot, self._weights(key))
            slot_of[key] = slot
        for slot in slot_of.values():
            self.slot_age[slot] = self.batches
        slots = [NO_ADAPTER if k is None else slot_of[k] for k in entry_keys]
        return LoraBatch.build(slots, extend_lens, device)

    def _weights(self, key: str) -> LoraWeights:
        weights = self.host.get(key)
        if weights is None:
            if key not in self.paths:
                raise RuntimeError(f"LoRA adapter {key} was never registered with the worker")
            path = self.paths[key]
            spec = read_spec(path, self.shapes, self.max_rank)  # checked again, hashed
            if not spec.digest.startswith(key):
                raise RuntimeError(f"the files of the LoRA adapter in {path} changed since it "
                                   "was loaded: an adapter's folder must stay as it was while "
                                   "it is served (unload it, then load the new files)")
            weights = load_lora(spec, key, self.shapes.parts, self.modules)
            self.loads += 1
            self.host[key] = weights
            while self.max_loaded is not None and len(self.host) > self.max_loaded:
                self.host.popitem(last=False)
        self.host.move_to_end(key)
        return weights

    def _fill(self, slot: int, weights: LoraWeights | None) -> None:
        for where, module in self.modules.items():
            pair = None if weights is None else weights.pairs.get(where)
            module.lora.fill(slot, *(pair or (None, None)))  # type: ignore[union-attr]

    @property
    def slot_bytes(self) -> int:
        return sum(m.lora.nbytes for m in self.modules.values())  # type: ignore[union-attr]
