"""GGUFFile: a GGUF file's metadata and tensor directory, its tensors memory-mapped and
dequantized on reading (whole, by rows, or by rows of the flattened matrix: one expert's).

The header is parsed here directly (gguf.GGUFReader builds a numpy view per tokenizer string and
takes seconds on a 49k-token vocabulary); tensors are dequantized by models/gguf_quants.py
(vectorized torch ops for the common types, gguf.quants.dequantize for the others). What the
tensors mean (their HF names, llama.cpp's transforms) is gguf_loader.py's and gguf_experts.py's.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
from torch import Tensor

from radixrt.runtime.models.gguf_quants import dequantize

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

    def raw_rows(self, name: str, start: int, stop: int) -> np.ndarray | None:
        """Rows [start, stop) of a 2-D tensor as stored: [rows, row bytes] uint8 (a read-only
        view of the file), or None when a row is not a whole number of blocks."""
        info = self.tensors[name]
        if len(info.shape) != 2:
            return None
        block, type_size = gguf.GGML_QUANT_SIZES[_QT(info.qtype)]
        if info.shape[1] % block:
            return None
        row_bytes = info.shape[1] // block * type_size
        first = info.start + start * row_bytes
        return self._data[first : first + (stop - start) * row_bytes].reshape(stop - start,
                                                                             row_bytes)

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
