"""A small step's decoder layers in one call of the CPU kernels (kernels/cpu/decoder.cpp).

At batch 1 a decode step of a small model is mostly Python: a few hundred module calls and
kernel launches around products that take microseconds each. When a forward pass is small (at
most MAX_GEMM_ROWS new tokens: decode rows, speculative drafts, a short chunk; no shared-prefix
group) on a model the fused step supports, CausalLM.forward hands all its layers to
rx_decode_layers instead: the same kernels the layers call one by one (packed products,
norms, rotary, KV stores, decode attention, activation), in the same order, so the hidden
states are the same floats, bit for bit (tests/runtime/models/test_fused_decode.py holds the
two side by side).

What it supports (FusedDecode.build says why not, and the layers then run one by one): tp_size
1, float32 on the CPU with the CPU kernels, every projection one packed part, pre-norm layers
(Llama's layout) with an optional per-head q/k norm, no experts, SiLU or GELU-tanh; LoRA
adapters (each row's own slot's products added after each projection, lora_add: the same sums
as models/lora_layer.py's in another order, so equal to float rounding, not bit for bit).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from radixrt.kernels.cpu_attention import slots_within
from radixrt.kernels.native import native_library
from radixrt.kernels.packed_gemm import MAX_GEMM_ROWS
from radixrt.kernels.packed_reference import PackedTensors
from radixrt.runtime.models.layers import GatedMLP

if TYPE_CHECKING:
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

# the model and its layers (models/decoder.py's CausalLM, DecoderLayer; not imported: decoder.py
# imports this module)
CausalLM = Any
DecoderLayer = Any

_C = ctypes
_CODES = {"u4": 0, "i8": 1}
# config.json activation -> kernels/cpu/layers.h ACT_*
FUSED_ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1,
                     "gelu_new": 1}
ROPE_TABLES = {"none": -1, "global": 0, "local": 1}


class PackedArg(ctypes.Structure):
    _fields_ = [("codes", _C.c_void_p), ("scales", _C.c_void_p), ("biases", _C.c_void_p),
                ("code", _C.c_int32), ("group", _C.c_int32), ("f16", _C.c_int32),
                ("unused", _C.c_int32), ("rows", _C.c_int64), ("cols", _C.c_int64)]


class LoraArg(ctypes.Structure):  # a projection's LoRA slots (LoraSlots); a null: none
    _fields_ = [("a", _C.c_void_p), ("b", _C.c_void_p), ("rank", _C.c_int64),
                ("slots", _C.c_int64)]


class LayerArg(ctypes.Structure):
    _fields_ = [("qkv", PackedArg), ("o", PackedArg), ("gate_up", PackedArg),
                ("down", PackedArg), ("qkv_bias", _C.c_void_p), ("o_bias", _C.c_void_p),
                ("gate_up_bias", _C.c_void_p), ("down_bias", _C.c_void_p),
                ("in_norm", _C.c_void_p), ("post_norm", _C.c_void_p), ("q_norm", _C.c_void_p),
                ("k_norm", _C.c_void_p), ("k_cache", _C.c_void_p), ("v_cache", _C.c_void_p),
                ("sinks", _C.c_void_p), ("window", _C.c_int64), ("scale", _C.c_float),
                ("logit_cap", _C.c_float), ("residual_scale", _C.c_float), ("act", _C.c_int32),
                ("rope", _C.c_int32), ("qkv_lora", LoraArg), ("o_lora", LoraArg),
                ("gate_up_lora", LoraArg), ("down_lora", LoraArg)]


class StepArg(ctypes.Structure):
    _fields_ = [("B", _C.c_int64), ("hidden", _C.c_int64), ("H", _C.c_int64),
                ("Hkv", _C.c_int64), ("D", _C.c_int64), ("inter", _C.c_int64),
                ("rotary_dim", _C.c_int64), ("eps", _C.c_float), ("norm_offset", _C.c_float),
                ("h", _C.c_void_p), ("cos", _C.c_void_p * 2), ("sin", _C.c_void_p * 2),
                ("out_slots", _C.c_void_p), ("qo_indptr", _C.c_void_p),
                ("kv_indptr", _C.c_void_p), ("kv_indices", _C.c_void_p),
                ("requests", _C.c_int64), ("scratch", _C.c_void_p),
                ("lora_slot", _C.c_void_p), ("lora_t", _C.c_void_p)]


def _packed_arg(weight: PackedTensors) -> PackedArg:
    return PackedArg(weight.codes.data_ptr(), weight.scales.data_ptr(), weight.biases.data_ptr(),
                     _CODES[weight.kind], weight.group,
                     int(weight.scales.dtype == torch.float16), 0, weight.rows, weight.cols)


def _lora_arg(module: torch.nn.Module) -> LoraArg:
    slots = getattr(module, "lora", None)
    if slots is None or slots.b_flat is None:
        return LoraArg(None, None, 0, 0)
    return LoraArg(slots.a.data_ptr(), slots.b_flat.data_ptr(), slots.a.shape[1],
                   slots.a.shape[0])


def _projections(layer: DecoderLayer) -> list[torch.nn.Module]:
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj]


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _one_packed(module: torch.nn.Module) -> PackedTensors | None:
    packed = getattr(module, "packed", None)
    if packed is None or len(packed.parts) != 1:
        return None
    data = packed.parts[0][1]
    return data if isinstance(data, PackedTensors) else None


def unsupported(model: CausalLM) -> str | None:
    """Why the model's layers cannot run fused (None: they can)."""
    cfg = model.config
    if model.tp.size != 1:
        return "tensor parallelism (the layers' collectives)"
    if cfg.kv_lora_rank:
        return "latent attention"
    if cfg.norm_layout != "pre" or cfg.qk_norm_all_heads:
        return f"{cfg.norm_layout}-norm layers or a norm over all heads"
    if cfg.hidden_act not in FUSED_ACTIVATIONS:
        return f"the {cfg.hidden_act} activation"
    for layer in model.layers:
        attn = layer.self_attn
        if not isinstance(layer.mlp, GatedMLP):
            return "experts"
        if not (attn.native and layer.input_layernorm.native and layer.mlp.native):
            return "the CPU kernels are off"
        if any(_one_packed(m) is None for m in (attn.qkv_proj, attn.o_proj,
                                                layer.mlp.gate_up_proj, layer.mlp.down_proj)):
            return "a projection that is not one packed tensor"
    return None


class FusedDecode:
    """The model's layers as rx_decode_layers arguments, built once per KV cache."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self._layers: ctypes.Array[LayerArg] | None = None
        # the KV pool the arguments point into: its address and shape (a pool freed and
        # another of another size allocated at the same address moves every layer's K and V)
        self._cache_key: tuple[int, tuple[int, ...]] | None = None
        # the LoRA slots the arguments point into (held: their memory stays while pointed at)
        self._lora: list[Any] = []

    @classmethod
    def build(cls, model: CausalLM) -> FusedDecode | None:
        return None if unsupported(model) is not None else cls(model)

    def applies(self, batch: ForwardBatch) -> bool:
        """A pass of at most MAX_GEMM_ROWS new tokens (decode rows, speculative drafts, short
        chunks), no shared-prefix group, LoRA adapters only where every projection holds float32
        slots, with the model's attention on the CPU kernels (another backend swapped in runs
        its own)."""
        return (0 < batch.num_tokens <= MAX_GEMM_ROWS and not batch.prefix_groups
                and (batch.lora is None or self._lora_slots() is not None)
                and getattr(self.model.attn_backend, "native", False))

    def _lora_slots(self) -> list[Any] | None:
        """Every projection's LoRA slots, float32 on the CPU (None: the model has none, or
        some the kernels cannot read)."""
        slots = [getattr(m, "lora", None) for layer in self.model.layers
                 for m in _projections(layer)]
        if any(s is None or s.b_flat is None or s.a.dtype != torch.float32 for s in slots):
            return None
        return slots

    def _layer_args(self, kv_cache: KVCache) -> ctypes.Array[LayerArg]:
        lora = [getattr(m, "lora", None) for layer in self.model.layers
                for m in _projections(layer)]
        key = (kv_cache.buffer.data_ptr(), tuple(kv_cache.buffer.shape))
        if (self._layers is None or self._cache_key != key
                or len(lora) != len(self._lora)
                or any(a is not b for a, b in zip(lora, self._lora))):
            self._lora = lora
            cfg = self.model.config
            args = (LayerArg * len(self.model.layers))()
            for i, (layer, kind) in enumerate(zip(self.model.layers, cfg.rope_kinds)):
                args[i] = self._layer_arg(layer, kind, kv_cache)
            self._layers, self._cache_key = args, key
        return self._layers

    def _layer_arg(self, layer: DecoderLayer, rope: str, kv_cache: KVCache) -> LayerArg:
        attn, mlp, cfg = layer.self_attn, layer.mlp, self.model.config
        spec = attn.spec
        parts = [_one_packed(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                          mlp.down_proj)]
        return LayerArg(
            *(_packed_arg(p) for p in parts if p is not None),
            _ptr(attn.qkv_proj.bias), _ptr(attn.o_proj.bias), _ptr(mlp.gate_up_proj.bias),
            _ptr(mlp.down_proj.bias), layer.input_layernorm.weight.data_ptr(),
            layer.post_attention_layernorm.weight.data_ptr(),
            _ptr(None if attn.q_norm is None else attn.q_norm.weight),
            _ptr(None if attn.k_norm is None else attn.k_norm.weight),
            kv_cache.k[spec.layer_id].data_ptr(), kv_cache.v[spec.layer_id].data_ptr(),
            _ptr(attn.sinks), spec.sliding_window or 0, spec.softmax_scale(attn.head_dim),
            spec.logit_cap, cfg.residual_scale, FUSED_ACTIVATIONS[cfg.hidden_act],
            ROPE_TABLES[rope], *(_lora_arg(m) for m in _projections(layer)))

    def run(self, h: Tensor, ropes: dict[str, tuple[Tensor, Tensor] | None], kv_cache: KVCache,
            batch: ForwardBatch) -> Tensor | None:
        """h [B, hidden] through every layer (in place); None where the kernels decline the
        shapes (the caller runs the layers one by one)."""
        cfg, model = self.model.config, self.model
        layers = self._layer_args(kv_cache)
        attn0 = model.layers[0].self_attn
        h = h.contiguous()
        b = h.shape[0]
        nqkv = attn0.qkv_proj.out_features
        inter = model.layers[0].mlp.intermediate_size
        scratch = torch.empty(b * (cfg.hidden_size + nqkv + attn0.num_heads * attn0.head_dim
                                   + 3 * inter + cfg.hidden_size), dtype=torch.float32)
        lora_slot, lora_t = None, None
        if batch.lora is not None:
            lora_slot = batch.lora.token_slot.to(torch.int64).contiguous()
            rank = max(s.a.shape[1] for s in self._lora)
            lora_t = torch.empty(b * rank, dtype=torch.float32)
        tables = [ropes.get("global"), ropes.get("local")]
        cos = [(t[0].reshape(b, -1).contiguous() if t is not None else None) for t in tables]
        sin = [(t[1].reshape(b, -1).contiguous() if t is not None else None) for t in tables]
        rotary_dim = next((2 * c.shape[1] for c in cos if c is not None), 0)
        slots, qo, indptr, indices = (t.to(torch.int64).contiguous() for t in (
            batch.out_slots, batch.qo_indptr, batch.kv_indptr, batch.kv_indices))
        pool = kv_cache.num_slots + 1
        if not (slots_within(slots, pool) and slots_within(indices, pool)):
            raise RuntimeError("a KV slot of the batch lies outside the pool")
        step = StepArg(b, cfg.hidden_size, attn0.num_heads, attn0.num_kv_heads, attn0.head_dim,
                       inter, rotary_dim, cfg.rms_norm_eps, cfg.norm_offset, h.data_ptr(),
                       (ctypes.c_void_p * 2)(*(_ptr(c) for c in cos)),
                       (ctypes.c_void_p * 2)(*(_ptr(s) for s in sin)), slots.data_ptr(),
                       qo.data_ptr(), indptr.data_ptr(), indices.data_ptr(),
                       batch.batch_size, scratch.data_ptr(), _ptr(lora_slot), _ptr(lora_t))
        status = native_library().rx_decode_layers(ctypes.addressof(layers), len(layers),
                                                   ctypes.addressof(step))
        if status != 0:
            return None
        backend = model.attn_backend  # the KV positions decode rows read, as the layers count
        decode = [n for n, d in zip(batch.seq_lens, batch.decode_mask) if d]
        backend.kv_positions_read += sum(
            sum(min(n, layer.self_attn.spec.sliding_window or n) for n in decode)
            for layer in model.layers)
        return h
