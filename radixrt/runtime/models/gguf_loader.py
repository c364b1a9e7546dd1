"""Load GGUF files (every architecture in models/gguf_archs.py): metadata, dequantized
HF-named tensors with llama.cpp's conversion transforms undone, tokenizer.

The header is parsed here directly (gguf.GGUFReader builds a numpy view per tokenizer string and
takes seconds on a 49k-token vocabulary); tensors are dequantized by models/gguf_quants.py
(vectorized torch ops for the common types, gguf.quants.dequantize for the others).
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from torch import Tensor

from radixrt.runtime.config import CACHE_DIR_ENV, DEFAULT_CACHE_DIR
from radixrt.runtime.models.gguf_archs import GLOBAL_NAMES, GGUFArchitecture, gguf_architecture
from radixrt.runtime.models.gguf_config import gguf_hf_config
from radixrt.runtime.models.gguf_experts import expert_tensors, shared_expert_gate, split_name
from radixrt.runtime.models.gguf_quants import dequantize
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.registry import model_config
from radixrt.runtime.models.tensor_source import Weight

_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}
_QT = gguf.GGMLQuantizationType
# numeric metadata arrays up to this long are decoded (per-layer values, sliding patterns);
# longer ones (a vocabulary's scores and types) and string arrays keep only their length
MAX_DECODED_ARRAY = 1024


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array not decoded: only its length is kept."""

    count: int


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    qtype: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # torch order (outermost first), e.g. (out_features, in_features)
    start: int  # absolute byte offset of the data in the file
    nbytes: int


class GGUFFile:
    """Scalar metadata and tensor directory of a GGUF file; tensor data is memory-mapped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with open(self.path, "rb") as f:
            head = f.read(24)
            magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", head)
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError(f"{self.path} is not a GGUF v2/v3 file")
            reader = _HeaderReader(f)
            self.metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = reader.string()
                self.metadata[key] = reader.value(reader.u32())
            infos = []
            for _ in range(n_tensors):
                name = reader.string()
                dims = [reader.u64() for _ in range(reader.u32())]
                qtype, offset = reader.u32(), reader.u64()
                infos.append((name, qtype, tuple(reversed(dims)), offset))
            align = int(self.metadata.get("general.alignment", 32))
            data_start = -(-reader.pos // align) * align
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, qtype, shape, offset in infos:
            block, type_size = gguf.GGML_QUANT_SIZES[_QT(qtype)]
            nbytes = int(np.prod(shape)) // block * type_size
            self.tensors[name] = GGUFTensorInfo(name, qtype, shape, data_start + offset, nbytes)
        self._data = np.memmap(self.path, dtype=np.uint8, mode="c")

    def tensor(self, name: str) -> Tensor:
        """Dequantized float32 tensor in torch order."""
        info = self.tensors[name]
        raw = self._data[info.start : info.start + info.nbytes]
        return dequantize(raw, info.qtype, info.shape)

    def rows(self, name: str, start: int, stop: int) -> Tensor | None:
        """Rows [start, stop) (outermost dimension) dequantized alone, or None when a row is
        not a whole number of quantization blocks (then read the tensor whole)."""
        info = self.tensors[name]
        row_elems = int(np.prod(info.shape[1:]))
        block, type_size = gguf.GGML_QUANT_SIZES[_QT(info.qtype)]
        if row_elems % block:
            return None
        row_bytes = row_elems // block * type_size
        first = info.start + start * row_bytes
        raw = self._data[first : first + (stop - start) * row_bytes]
        return dequantize(raw, info.qtype, (stop - start, *info.shape[1:]))

    def flat_rows(self, name: str, start: int, stop: int) -> Tensor:
        """Rows [start, stop) of the tensor seen as a matrix [prod(shape[:-1]), shape[-1]]
        (one expert's rows of a stacked [E, R, C] tensor), dequantized alone."""
        info = self.tensors[name]
        cols = info.shape[-1]
        block, type_size = gguf.GGML_QUANT_SIZES[_QT(info.qtype)]
        if cols % block:
            raise ValueError(f"{name}: rows of {cols} values are not whole blocks of {block}")
        row_bytes = cols // block * type_size
        first = info.start + start * row_bytes
        raw = self._data[first : first + (stop - start) * row_bytes]
        return dequantize(raw, info.qtype, (stop - start, cols))


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


class _HeaderReader:
    """Sequential little-endian reader of the GGUF header; long and string arrays are skipped,
    not decoded."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.pos = 24

    def _read(self, n: int) -> bytes:
        self.pos += n
        return self.f.read(n)

    def u32(self) -> int:
        return struct.unpack("<I", self._read(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self._read(8))[0]

    def string(self) -> str:
        return self._read(self.u64()).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype == gguf.GGUFValueType.ARRAY:
            return self.array(self.u32(), self.u64())
        fmt = _SCALAR_FORMATS[gguf.GGUFValueType(vtype)]
        value = struct.unpack(fmt, self._read(struct.calcsize(fmt)))[0]
        if vtype == gguf.GGUFValueType.FLOAT32:  # the shortest decimal, as config.json has it
            return float(str(np.float32(value)))  # (1e-05, not 9.999999747378752e-06)
        return value

    def array(self, item_type: int, count: int) -> tuple[Any, ...] | SkippedArray:
        """A short numeric array as a tuple; anything else skipped (a vocabulary, its scores)."""
        if item_type == gguf.GGUFValueType.STRING:
            for _ in range(count):
                length = self.u64()
                self.pos += length
                self.f.seek(self.pos)
        elif item_type == gguf.GGUFValueType.ARRAY:
            for _ in range(count):
                self.array(self.u32(), self.u64())
        else:
            fmt = _SCALAR_FORMATS[gguf.GGUFValueType(item_type)]
            size = count * struct.calcsize(fmt)
            if count <= MAX_DECODED_ARRAY:
                return struct.unpack(f"<{count}{fmt[1:]}", self._read(size))
            self.pos += size
            self.f.seek(self.pos)
        return SkippedArray(count)


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
    stacked experts one expert at a time (models/gguf_experts.py). A tensor this architecture
    does not have is refused (the model would run without it)."""
    arch = gguf_architecture(gf.metadata)
    for name in gf.tensors:
        if arch.experts and split_name(name) is not None:
            yield from expert_tensors(gf, name, config.num_experts)
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
