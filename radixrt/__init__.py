"""radixrt: a radix-tree-centric structured-generation runtime.

Public API only. Heavy parts (torch, the model) load on first use, so a frontend that talks to a
remote runtime never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixrt.runtime.engine import Engine
    from radixrt.runtime.outputs import CompletionOutput, RequestOutput, StreamChunk

__all__ = [
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "RequestOutput",
    "SamplingParams",
    "StreamChunk",
]
__version__ = "0.1.0"

_LAZY = {
    "Engine": "radixrt.runtime.engine",
    "RequestOutput": "radixrt.runtime.outputs",
    "CompletionOutput": "radixrt.runtime.outputs",
    "StreamChunk": "radixrt.runtime.outputs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixrt' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
