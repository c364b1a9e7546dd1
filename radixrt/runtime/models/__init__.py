"""Model code (one decoder, a registry of families) and weight loaders.

The names below load their modules (and torch) when first used, so that a process that reads
only a torch-free module of this package (the scheduler: models/lora_format.py) never imports
torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CausalLM": "radixrt.runtime.models.decoder",
    "LoadedModel": "radixrt.runtime.models.loader",
    "default_model_path": "radixrt.runtime.models.loader",
    "load_model": "radixrt.runtime.models.loader",
    "ModelConfig": "radixrt.runtime.models.model_config",
    "supported_architectures": "radixrt.runtime.models.registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
