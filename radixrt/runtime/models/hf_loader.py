"""Load Hugging Face checkpoint folders: config.json, *.safetensors, tokenizer files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.registry import model_config
from radixrt.runtime.models.tensor_source import SafetensorsSlice
from radixrt.runtime.models.vision.families import text_config_of, vision_family_of
from radixrt.runtime.models.vision.processors import load_processor

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # an image processor's


def hf_config(folder: str) -> ModelConfig:
    """The decoder's config (a vision-language model's: its text_config's)."""
    cfg = read_hf_config(folder)
    if vision_family_of(cfg) is None:
        return model_config(cfg)
    text = text_config_of(cfg)
    return replace(model_config(text), mrope_section=tuple(text.get("mrope_section", ())))


def read_hf_config(folder: str) -> dict[str, Any]:
    """config.json as transformers reads it (as_transformers_reads)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json")
    with open(path) as f:
        return as_transformers_reads(json.load(f))


def as_transformers_reads(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json completed as transformers reads it: the family's config class fills every
    key the file leaves at its default (checkpoints list only what differs: Gemma 3's
    multimodal text_config names five keys), maps legacy spellings (rope_scaling's "type", a
    top-level rope_theta, Gemma's "gelu") and derives what later versions write out
    (layer_types from use_sliding_window / max_window_layers). A model_type transformers does not
    know is passed through as it is (the registry refuses it by name)."""
    from transformers import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return cfg
    try:
        full = CONFIG_MAPPING[model_type].from_dict(dict(cfg)).to_dict()
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"config.json does not read as a {model_type!r} config: {exc}") from None
    if cfg.get("architectures"):
        full["architectures"] = list(cfg["architectures"])
    return full


def iter_safetensors_weights(folder: str) -> Iterator[tuple[str, SafetensorsSlice]]:
    """(name, lazy tensor) pairs of every *.safetensors file in the folder, in file order: a
    rank reads only its shard's range of each (the file stays open while it is consumed)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, SafetensorsSlice(f.get_slice(name))


def load_hf_tokenizer(folder: str) -> Any | None:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    if not any(os.path.isfile(os.path.join(folder, name)) for name in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def load_hf_processor(folder: str) -> Any | None:
    """A vision-language model's processor (its image processor and image token), or None
    for a text model -- or for a vision-language checkpoint shipped without its image
    processor's file (its decoder then serves text alone)."""
    if not (Path(folder) / "config.json").is_file() or not any(
            (Path(folder) / name).is_file() for name in _PROCESSOR_FILES):
        return None
    cfg = read_hf_config(folder)
    family = vision_family_of(cfg)
    if family is None:
        return None
    return load_processor(folder, str(cfg.get("model_type")), family.image_token)
