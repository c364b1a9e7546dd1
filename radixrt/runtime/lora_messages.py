"""The wire messages of LoRA adapters (runtime/models/lora_format.py reads the adapters): what
the worker reports it can adapt, how the scheduler names an adapter to the worker, and a
request front's load or unload. messages.py carries them in its own messages."""

from __future__ import annotations

import msgspec


class LoraModuleShapes(msgspec.Struct, frozen=True):
    """The full (unsharded) shapes of the projections an adapter may adapt, by the decoder's
    module name (qkv_proj, o_proj, gate_up_proj, down_proj): each part's output rows (q, k, v /
    gate, up), the input columns, and the layers that have the module (an MoE layer has no
    dense MLP)."""

    parts: dict[str, list[int]]
    inputs: dict[str, int]
    layers: dict[str, list[int]]


class LoraAdapter(msgspec.Struct, frozen=True):
    """A LoRA adapter's folder (PEFT's format), checked by the scheduler against the model, and
    the key requests name it by in the worker (its files' digest: the same files, the same
    key, whatever names they are served under)."""

    key: str
    path: str


class LoraRequest(msgspec.Struct, frozen=True, tag=True):
    """Load the LoRA adapter in folder `path` as `name` (path None: unload `name`). Answered
    with a ControlReply: {"ok": true, "adapter": {...}} or {"ok": false, "error": message}."""

    call_id: int
    name: str
    path: str | None = None
