"""Checkpoint tensors that a tensor-parallel rank reads only in part.

A loader yields each weight as a Tensor or as a TensorSource: something with a shape that reads
a contiguous range along one dimension without reading the rest (safetensors' lazy slices; GGUF
rows, dequantized block row by block row). A rank takes the rows or columns of its shard
(models/parallel.py, `take`); a replicated weight is read whole. At tp_size 1 every read is the
whole tensor, as before. A source whose data has a packed form (GGUF's quantized types) also
reads rows packed (`read_packed`), for layers that keep weights packed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Union

from torch import Tensor

if TYPE_CHECKING:
    from radixrt.kernels.packed_reference import PackedTensors


class TensorSource(Protocol):
    shape: tuple[int, ...]

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        """float32 entries [start, stop) along dim, every entry of the other dimensions."""
        ...


Weight = Union[Tensor, "TensorSource"]


def shape_of(weight: Weight) -> tuple[int, ...]:
    return tuple(weight.shape)


def read_range(weight: Weight, dim: int, start: int, stop: int) -> Tensor:
    if isinstance(weight, Tensor):
        return weight.narrow(dim, start, stop - start)
    return weight.read(dim, start, stop)


def read_all(weight: Weight) -> Tensor:
    return weight if isinstance(weight, Tensor) else weight.read(0, 0, weight.shape[0])


def read_packed(weight: Weight, start: int, stop: int) -> PackedTensors | None:
    """Rows [start, stop) packed as the checkpoint stores them; None where the weight has no
    packed form (a float tensor, a type without one)."""
    reader = getattr(weight, "read_packed", None)
    return None if reader is None else reader(start, stop)


class SafetensorsSlice:
    """A tensor of an open safetensors file, read by ranges (safe_open's get_slice)."""

    def __init__(self, lazy: Any) -> None:
        self._lazy = lazy
        self.shape = tuple(lazy.get_shape())

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        index = tuple([slice(None)] * dim + [slice(start, stop)])
        return self._lazy[index]


class RowRange:
    """Rows [start, stop) of another weight, as a TensorSource: one part of a fused checkpoint
    tensor (Phi-3's qkv_proj, gate_up_proj) read as if it were a tensor of its own."""

    def __init__(self, source: Weight, start: int, stop: int) -> None:
        rows = shape_of(source)[0]
        if not 0 <= start < stop <= rows:
            raise ValueError(f"rows [{start}, {stop}) are not inside a tensor of {rows} rows")
        self.source = source
        self.start = start
        self.stop = stop
        self.shape = (stop - start, *shape_of(source)[1:])

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        if dim == 0:
            return read_range(self.source, 0, self.start + start, self.start + stop)
        whole = read_range(self.source, 0, self.start, self.stop)
        return whole.narrow(dim, start, stop - start)

    def read_packed(self, start: int, stop: int) -> PackedTensors | None:
        return read_packed(self.source, self.start + start, self.start + stop)
