"""LoRA adapters in PEFT's format, read without torch: `adapter_config.json` and the header of
`adapter_model.safetensors` (the tensors' names and shapes), checked against the model the
adapter will run on, before any weight is read.

PEFT stores a LoRA pair per adapted linear layer, `<module>.lora_A.weight` [r, in] and
`<module>.lora_B.weight` [out, r]; the layer computes y = x W^T + scale * (x A^T) B^T with
scale = lora_alpha / r (lora_alpha / sqrt(r) under rsLoRA), per module where `rank_pattern` /
`alpha_pattern` say so. The decoder fuses q, k, v into `qkv_proj` and gate, up into
`gate_up_proj` (models/decoder.py): a projection maps to its fused module and its part there
(Phi-3's checkpoints, fused already, adapt the whole fused module).

What an adapter may not do here is refused with a message naming it: DoRA, biases, LoRA on the
embedding or the LM head (`lora_embedding_*`, `modules_to_save`), Conv1D layouts
(`fan_in_fan_out`), a rank past the server's --max-lora-rank, a module the model lacks or whose
shape differs from the model's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field

from radixrt.runtime.lora_messages import LoraModuleShapes

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20  # adapter_config.json
MAX_HEADER_BYTES = 16 << 20  # the safetensors JSON header
HASH_CHUNK_BYTES = 1 << 20
# PEFT's module name -> (the decoder's module, its part there; None: the whole module)
MODULE_TARGETS: dict[str, tuple[str, int | None]] = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "qkv_proj": ("qkv_proj", None), "o_proj": ("o_proj", None),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    "gate_up_proj": ("gate_up_proj", None), "down_proj": ("down_proj", None),
}
LORA_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # the decoder's, in order
MAX_PATTERNS = 4096  # rank_pattern / alpha_pattern entries
MAX_PATTERN_CHARS = 256
MAX_DIM = 1 << 20  # a LoRA tensor's dimension
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.]+")
_FLOAT_BITS = {"F32": 32, "F16": 16, "BF16": 16}
_EXPONENT_MASKS = {"F32": 0x7F800000, "F16": 0x7C00, "BF16": 0x7F80}  # all ones: NaN or inf
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
_REFUSED_KEYS = (("lora_magnitude_vector", "DoRA (use_dora)"),
                 ("lora_embedding_", "LoRA on the embedding"), (".bias", "a LoRA bias"))
_REFUSED_FLAGS = (("use_dora", "DoRA (use_dora)"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D)"),
                  ("lora_bias", "a LoRA bias (lora_bias)"))


@dataclass(frozen=True)
class Tensorinfo:
    shape: list[int]
    dtype: str
    start: int  # its first byte in the file
    nbytes: int


@dataclass(frozen=True)
class LoraPair:
    """One adapted projection: PEFT's tensor names and its rank and scale."""

    layer: int
    module: str  # the decoder's (qkv_proj, o_proj, gate_up_proj, down_proj)
    part: int | None  # the part of a fused module; None: all of it
    a_name: str
    b_name: str
    rank: int
    scale: float


@dataclass(frozen=True)
class LoraSpec:
    """An adapter, checked: its pairs, its largest rank, and a digest of its files (the radix
    tree's namespace for its KV: the same files, the same KV)."""

    path: str
    pairs: tuple[LoraPair, ...]
    rank: int
    digest: str
    modules: frozenset[str] = field(default_factory=frozenset)


def read_spec(path: str, shapes: LoraModuleShapes, max_rank: int,
              digest: bool = True) -> LoraSpec:
    """The adapter in folder `path`, checked against the model's `shapes`; ValueError with a
    message saying what is wrong (and what to do) otherwise. digest=False: its files are not
    hashed (the worker, which knows the adapter by the digest the scheduler took)."""
    config = _read_config(path)
    header = _read_header(os.path.join(path, WEIGHTS_FILE))
    for key in header:
        for marker, what in _REFUSED_KEYS:
            if marker in key:
                raise ValueError(f"{what} is not supported (tensor {key!r} of {path})")
    found: dict[tuple[int, str], dict[str, str]] = {}
    for key in header:
        match = _KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"tensor {key!r} of {path} is not a LoRA pair of a layer's "
                             f"projection ({', '.join(MODULE_TARGETS)})")
        layer, name, side = int(match[1]), match[2], match[3]
        found.setdefault((layer, name), {})[side] = key
    pairs = [_pair(path, layer, name, sides, header, config, shapes, max_rank)
             for (layer, name), sides in sorted(found.items())]
    if not pairs:
        raise ValueError(f"{path} holds no LoRA weights")
    _check_overlaps(path, pairs)
    if digest:  # the scheduler's check, before the adapter is served
        _check_finite(os.path.join(path, WEIGHTS_FILE), header)
    return LoraSpec(path, tuple(pairs), max(p.rank for p in pairs),
                    _digest(path) if digest else "",
                    frozenset(p.module for p in pairs))


def _read_config(path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file) or not os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
        raise ValueError(f"{path!r} is not a PEFT LoRA adapter folder: it needs {CONFIG_FILE} "
                         f"and {WEIGHTS_FILE}")
    if os.path.getsize(file) > MAX_CONFIG_BYTES:
        raise ValueError(f"{file} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{path} is a {config.get('peft_type')} adapter; only LoRA is served")
    for flag, what in _REFUSED_FLAGS:
        if config.get(flag):
            raise ValueError(f"{what} is not supported ({path})")
    if config.get("bias", "none") not in ("none", None):
        raise ValueError(f"bias={config['bias']!r} is not supported ({path}): LoRA without "
                         "bias training only")
    if config.get("modules_to_save"):
        raise ValueError(f"modules_to_save={config['modules_to_save']!r} is not supported "
                         f"({path}): only LoRA pairs on the projections")
    for name in ("r", "lora_alpha"):
        _check_number(config.get(name, 8), name, file)
    for name in ("rank_pattern", "alpha_pattern"):
        patterns = config.get(name) or {}
        if not isinstance(patterns, dict) or len(patterns) > MAX_PATTERNS:
            raise ValueError(f"{name} in {file} must be an object of at most {MAX_PATTERNS} "
                             "module names")
        for key, value in patterns.items():
            if len(key) > MAX_PATTERN_CHARS or not _PLAIN_KEY.fullmatch(key):
                raise ValueError(f"{name} key {key[:64]!r} in {file}: give a module's name or "
                                 "dotted path (regular expressions are not supported)")
            _check_number(value, f"{name}[{key!r}]", file)
    return config


def _check_number(value: object, name: str, file: str) -> None:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or not value > 0):
        raise ValueError(f"{name}={value!r} in {file} must be a positive finite number")


def _read_header(file: str) -> dict[str, Tensorinfo]:
    """The safetensors header: tensor name -> its shape, dtype and bytes (float tensors only,
    every one within the file)."""
    try:
        with open(file, "rb") as f:
            raw = f.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= MAX_HEADER_BYTES:
                raise ValueError(f"{file} is not a safetensors file")
            header = json.loads(f.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, struct.error) as exc:
        raise ValueError(f"{file} is not a readable safetensors file: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    data_bytes = os.path.getsize(file) - 8 - size
    out: dict[str, Tensorinfo] = {}
    for key, info in header.items():
        if not isinstance(info, dict) or info.get("dtype") not in _FLOAT_BITS:
            raise ValueError(f"tensor {key!r} of {file} is not float32/16 or bfloat16")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (not isinstance(shape, list) or len(shape) > 2
                or not all(isinstance(d, int) and 0 <= d <= MAX_DIM for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes
                or offsets[1] - offsets[0] != math.prod(shape) * _FLOAT_BITS[info["dtype"]] // 8):
            raise ValueError(f"tensor {key!r} of {file} has a malformed shape or offsets")
        out[key] = Tensorinfo(shape, info["dtype"], 8 + size + offsets[0],
                              offsets[1] - offsets[0])
    return out


def _check_finite(file: str, tensors: dict[str, Tensorinfo]) -> None:
    """Every value a finite float (one NaN or infinity would reach every row of a batch
    that mixes adapters): read from the raw bits, without torch."""
    import numpy as np

    with open(file, "rb") as f:
        for key, info in tensors.items():
            f.seek(info.start)
            bits = _FLOAT_BITS[info.dtype]
            raw = np.frombuffer(f.read(info.nbytes), dtype=f"<u{bits // 8}")
            exponent = _EXPONENT_MASKS[info.dtype]
            if bool(((raw & exponent) == exponent).any()):
                raise ValueError(f"tensor {key!r} of {file} holds a NaN or an infinity")


def _pair(path: str, layer: int, name: str, sides: dict[str, str],
          header: dict[str, Tensorinfo], config: dict, shapes: LoraModuleShapes,
          max_rank: int) -> LoraPair:
    where = f"layer {layer}'s {name} in {path}"
    if name not in MODULE_TARGETS:
        raise ValueError(f"LoRA on {where}: {name} is not an adaptable projection (use "
                         f"{', '.join(MODULE_TARGETS)})")
    module, part = MODULE_TARGETS[name]
    if layer not in shapes.layers.get(module, ()):
        raise ValueError(f"LoRA on {where}: the model has no such layer or module there")
    if set(sides) != {"A", "B"}:
        raise ValueError(f"{where} has lora_{''.join(sides)} without its other half")
    a, b = header[sides["A"]].shape, header[sides["B"]].shape
    parts = shapes.parts[module]
    out = sum(parts) if part is None else parts[part]
    cols = shapes.inputs[module]
    if len(a) != 2 or len(b) != 2 or a[1] != cols or b[0] != out or a[0] != b[1]:
        raise ValueError(f"{where}: lora_A {a} and lora_B {b} do not fit the model's "
                         f"projection of {cols} inputs and {out} outputs")
    rank = a[0]
    if not 0 < rank <= max_rank:
        raise ValueError(f"{where} has rank {rank}, above the server's --max-lora-rank "
                         f"{max_rank}; restart with a larger --max-lora-rank")
    module_path = sides["A"].removesuffix(".lora_A.weight")
    alpha = float(_pattern(config.get("alpha_pattern"), module_path,
                           config.get("lora_alpha", 8)))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraPair(layer, module, part, sides["A"], sides["B"], rank, scale)


def _pattern(patterns: object, module_path: str, default: object) -> object:
    """PEFT's alpha_pattern: the first key that is the module's path or its end after a dot
    (PEFT's rule for a key that names modules; keys are checked plain in _read_config)."""
    if not isinstance(patterns, dict):
        return default
    for key, value in patterns.items():
        if module_path == key or module_path.endswith("." + key):
            return value
    return default


def _check_overlaps(path: str, pairs: list[LoraPair]) -> None:
    """A fused module adapted whole and by part at once is ambiguous."""
    seen: dict[tuple[int, str], set[int | None]] = {}
    for p in pairs:
        parts = seen.setdefault((p.layer, p.module), set())
        if None in parts or (p.part is None and parts) or p.part in parts:
            raise ValueError(f"{path}: layer {p.layer}'s {p.module} is adapted twice")
        parts.add(p.part)


def _digest(path: str) -> str:
    """sha256 of the adapter's two files, hex (the first 16 digits name its KV namespace)."""
    h = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(os.path.join(path, name), "rb") as f:
            while chunk := f.read(HASH_CHUNK_BYTES):
                h.update(chunk)
    return h.hexdigest()


def module_shapes(hidden: int, q_rows: int, kv_rows: int, intermediate: int,
                  dense_mlp_layers: list[int], num_layers: int) -> LoraModuleShapes:
    """The adaptable projections of a decoder with these sizes (models/decoder.py's)."""
    every = list(range(num_layers))
    return LoraModuleShapes(
        parts={"qkv_proj": [q_rows, kv_rows, kv_rows], "o_proj": [hidden],
               "gate_up_proj": [intermediate, intermediate], "down_proj": [hidden]},
        inputs={"qkv_proj": hidden, "o_proj": q_rows, "gate_up_proj": hidden,
                "down_proj": intermediate},
        layers={"qkv_proj": every, "o_proj": every, "gate_up_proj": dense_mlp_layers,
                "down_proj": dense_mlp_layers})


LORA_NAMESPACE_MARK = "\x00lora:"
ADAPTER_KEY_DIGITS = 16


def adapter_key(digest: str) -> str:
    """The key requests name an adapter by in the worker and the radix tree: its files'
    digest's first ADAPTER_KEY_DIGITS digits."""
    return digest[:ADAPTER_KEY_DIGITS]


def lora_namespace_of(key: str) -> str:
    """The prefix every radix namespace of the adapter with this key begins with."""
    return LORA_NAMESPACE_MARK + key


def lora_namespace(digest: str, cache_salt: str | None) -> str:
    """The radix tree's namespace of a request under the adapter of `digest`: apart from the
    base model's and every other adapter's (a NUL never appears in a cache_salt)."""
    return lora_namespace_of(adapter_key(digest)) + (
        "" if cache_salt is None else "\x00" + cache_salt)


def split_namespace(extra_key: str | None) -> tuple[str | None, str | None]:
    """A radix namespace as (adapter key, cache_salt), each None where there is none: the
    inverse of lora_namespace (and of a plain cache_salt's namespace, the salt itself)."""
    if extra_key is None or not extra_key.startswith(LORA_NAMESPACE_MARK):
        return None, extra_key
    key, sep, salt = extra_key[len(LORA_NAMESPACE_MARK):].partition("\x00")
    return key, salt if sep else None
