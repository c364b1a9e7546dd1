"""ModelFamily: what the registry knows of one family of architectures."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import Weight

ConfigReader = Callable[[Mapping[str, Any], str], ModelConfig]
WeightRenamer = Callable[[str, Weight, ModelConfig], Iterable[tuple[str, Weight]]]


def same_names(name: str, weight: Weight, config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    """The checkpoint already uses the decoder's (Llama's) tensor names."""
    yield name, weight


@dataclass(frozen=True)
class ModelFamily:
    """architectures: config.json "architectures" names; model_types: its "model_type" values
    (used when "architectures" is missing); gguf_architectures: GGUF general.architecture
    values. read_config turns config.json (a dict) and the architecture name into ModelConfig;
    rename maps one checkpoint tensor to the decoder's names (splitting fused tensors).
    features: what the Models table of docs/models.md says of it."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    read_config: ConfigReader
    rename: WeightRenamer = same_names
    tensor_parallel: bool = True
    features: Mapping[str, str] = field(default_factory=dict)
