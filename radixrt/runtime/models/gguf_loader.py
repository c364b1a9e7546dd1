"""Load GGUF files (every architecture in models/gguf_archs.py): metadata, dequantized
HF-named tensors with llama.cpp's conversion transforms undone, tokenizer.

The file itself (header, tensor directory, dequantized reads) is read by models/gguf_file.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from radixrt.kernels.packed_reference import PackedTensors
from radixrt.runtime.models.gguf_archs import GLOBAL_NAMES, GGUFArchitecture, gguf_architecture
from radixrt.runtime.models.gguf_config import gguf_hf_config
from radixrt.runtime.models.gguf_deepseek import is_split_kv_b, mtp_layer, split_kv_b
from radixrt.runtime.models.gguf_experts import expert_tensors, shared_expert_gate, split_name
from radixrt.runtime.models.gguf_file import GGUFFile
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.packed_gguf import PACKED_QTYPES, pack_gguf_rows
from radixrt.runtime.models.packed_weight import select_rows
from radixrt.runtime.models.registry import model_config
from radixrt.runtime.models.tensor_source import Weight

# Converting a GGUF tokenizer takes seconds; the converted one is saved under this folder
# (override with the environment variable below) and reused while the GGUF file is unchanged.
CACHE_DIR_ENV = "RADIXRT_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/radixrt"


class GGUFWeight:
    """One GGUF tensor as a TensorSource (models/tensor_source.py): a range of rows is read and
    dequantized alone. What llama.cpp's converter did to the HF tensor is undone on reading:
    Q/K rows it permuted within each head are un-permuted head by head (a shard's rows are
    whole heads), and the offset it added to Gemma's norm weights is subtracted."""

    def __init__(self, gf: GGUFFile, name: str, rope_heads: int | None = None,
                 offset: float = 0.0) -> None:
        self.gf = gf
        self.name = name
        self.rope_heads = rope_heads  # heads whose rows to un-permute, or None
        self.offset = offset  # subtracted from every value
        self.shape = gf.tensors[name].shape

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        head_rows = self.shape[0] // self.rope_heads if self.rope_heads else 1
        whole_heads = start % head_rows == 0 and stop % head_rows == 0
        part = self.gf.rows(self.name, start, stop) if dim == 0 and whole_heads else None
        if part is None:
            full = self.gf.tensor(self.name)
            if self.rope_heads:
                full = unpermute_rope_rows(full, self.rope_heads)
            part = full.narrow(dim, start, stop - start)
        elif self.rope_heads:
            part = unpermute_rope_rows(part, (stop - start) // head_rows)
        return part - self.offset if self.offset else part


    def read_packed(self, start: int, stop: int) -> PackedTensors | None:
        """Rows [start, stop) packed (models/packed_gguf.py), the Q/K rows un-permuted as read()
        does; None for a type without a packed form, or a norm (its offset is not packed)."""
        info = self.gf.tensors[self.name]
        if self.offset or info.qtype not in PACKED_QTYPES:
            return None
        if not self.rope_heads:
            raw = self.gf.raw_rows(self.name, start, stop)
            return None if raw is None else pack_gguf_rows(raw, info.qtype, self.shape[1])
        head_rows = self.shape[0] // self.rope_heads  # un-permute whole heads, then take rows
        first, last = start // head_rows * head_rows, -(-stop // head_rows) * head_rows
        raw = self.gf.raw_rows(self.name, first, last)
        if raw is None:
            return None
        packed = pack_gguf_rows(raw, info.qtype, self.shape[1])
        if packed is None:
            return None
        order = unpermute_rope_rows(torch.arange(last - first), (last - first) // head_rows)
        return select_rows(packed, order[start - first : stop - first].tolist())


def unpermute_rope_rows(w: Tensor, n_heads: int) -> Tensor:
    """Undo llama.cpp's conversion permute of Q/K rows (interleaved rope pairs -> rotate-half).

    llama.cpp runs the LlamaModel architectures (llama, granite, smollm3) with interleaved
    (GPT-J style) RoPE, which rotates rows 2i and 2i + 1 of a head together; HF rotates rows i
    and i + head_dim / 2 (rotate-half), as our rotary does. So the converter reorders each
    head's rows from [half, pair_index] to [pair_index, half]; this puts them back.
    """
    rest = w.shape[1:]
    half_dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half_dim, 2, *rest).transpose(1, 2).reshape(w.shape)


def hf_name(gguf_name: str, arch: GGUFArchitecture) -> str | None:
    """HF tensor name of a GGUF tensor name in this architecture (None: not a model weight;
    stacked experts are named by gguf_experts.py)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        whole = arch.layer_tensors.get(f"{part}.{suffix}")
        if whole is not None:
            return f"model.layers.{layer}.{whole}"
        module = arch.layer_names.get(part)
        return None if module is None else f"model.layers.{layer}.{module}.{suffix}"
    module = GLOBAL_NAMES.get(base)
    return None if module is None else f"{module}.{suffix}"


def gguf_config(gf: GGUFFile) -> ModelConfig:
    """The file's ModelConfig, read by its family (the RoPE factor tensors included)."""
    arch = gguf_architecture(gf.metadata)
    shapes = {name: info.shape for name, info in gf.tensors.items()}
    factors = {name: gf.tensor(name).flatten().tolist()
               for name in arch.config_tensors if name in gf.tensors}
    return model_config(gguf_hf_config(gf.metadata, shapes, factors))


def iter_gguf_weights(gf: GGUFFile, config: ModelConfig) -> Iterator[tuple[str, Weight]]:
    """(HF name, lazy float32 tensor) pairs, with the converter's transforms undone on reading;
    stacked experts one expert at a time (models/gguf_experts.py), a split kv_b_proj joined
    (models/gguf_deepseek.py), multi-token-prediction layers left out. A tensor this
    architecture does not have is refused (the model would run without it)."""
    arch = gguf_architecture(gf.metadata)
    for name in gf.tensors:
        if mtp_layer(name, gf.metadata, arch.name, config.num_layers):
            continue
        if arch.experts and split_name(name) is not None:
            yield from expert_tensors(gf, name, config.num_experts)
            continue
        if arch.latent_attention and is_split_kv_b(name):
            yield from split_kv_b(gf, name, config)
            continue
        target = hf_name(name, arch)
        if target is None:
            if name in arch.config_tensors:
                continue
            raise ValueError(f"the {arch.name} GGUF has a tensor {name!r} that radixrt's "
                             f"{arch.hf_architecture} does not use: not supported")
        heads = None
        if arch.permuted_qk and ".q_proj." in target:
            heads = config.num_heads
        elif arch.permuted_qk and ".k_proj." in target:
            heads = config.num_kv_heads
        offset = arch.norm_offset if target.endswith("norm.weight") else 0.0
        if target.endswith(".shared_expert_gate.weight"):
            yield target, shared_expert_gate(gf, name)
            continue
        yield target, GGUFWeight(gf, name, heads, offset)


def load_gguf_tokenizer(path: str) -> Any:
    """transformers tokenizer of a GGUF file, converted once and then reused from the disk cache."""
    from transformers import AutoTokenizer

    folder, fname = os.path.split(os.path.abspath(path))
    stat = os.stat(path)
    cache_root = Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser()
    cached = cache_root / "tokenizers" / f"{Path(fname).stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (cached / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached))
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt below
            shutil.rmtree(cached, ignore_errors=True)
    tokenizer = _convert_gguf_tokenizer(folder, fname)
    tmp: str | None = None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cached.parent)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, cached)
    except OSError:  # read-only or racing writers: the cache is only an optimisation
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def _convert_gguf_tokenizer(folder: str, fname: str) -> Any:
    """AutoTokenizer first reads the file as a transformers model config, which it can for only
    some architectures (not gemma, granite, olmo2 or smollm3 today; its gpt-oss reader fails on
    YaRN keys with a TypeError). The tokenizer itself is built from the tokenizer.ggml.* keys
    whatever the architecture, so where AutoTokenizer fails on the file the generic fast
    tokenizer reads them."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    except (ValueError, TypeError, KeyError) as auto_error:
        try:
            return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=fname)
        except Exception as error:  # noqa: BLE001 - both ways failed: say so, with both
            raise ValueError(f"cannot build the tokenizer of {fname}: {auto_error}; "
                             f"{error}") from error
