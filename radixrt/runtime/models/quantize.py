"""Weight-only quantization at load (--quantization) for checkpoints of float weights: the
projections, the embedding and the LM head quantized per group of 32 along their input
dimension into the packed layout the packed kernels multiply (kernels/packed_reference.py):

    int8  i8 codes -127..127, a float16 scale per group (absmax / 127), no bias
    int4  u4 codes 0..15, a float16 scale and bias per group (min .. max in 15 steps) for the
          projections; the embedding and the LM head in int8 (as llama.cpp's 4-bit files keep
          them at 8 bits)

The scale and bias are float16 values chosen first and the codes rounded against them, so the
packed weight is exactly what its layout says. A checkpoint tensor is wrapped as a source that
reads its rows packed (QuantizedSource.read_packed): a layer takes its shard's rows or columns
of the quantized rows, so tensor-parallel ranks hold the slices of one quantization.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from radixrt.kernels.packed_reference import PackedTensors
from radixrt.runtime.models.tensor_source import Weight, read_range, shape_of

QUANTIZATIONS = ("int8", "int4")
GROUP = 32
# the checkpoint tensors quantized (after the family's renames): projections, embedding, head
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "qkv_proj", "gate_up_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")
# (latent attention's kv_b_proj stays in floats: it is folded into the query, models/mla.py)
_TABLES = ("embed_tokens", "lm_head")


def quantize_int8(w: Tensor) -> PackedTensors:
    """w [rows, cols] float -> i8 codes, a float16 scale per group of 32 (absmax / 127)."""
    rows, cols = w.shape
    groups = w.float().reshape(rows, cols // GROUP, GROUP)
    scale = (groups.abs().amax(-1) / 127).to(torch.float16)  # [rows, groups]
    safe = torch.where(scale > 0, scale.float(), torch.ones(()))
    codes = torch.round(groups / safe.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return PackedTensors(codes.reshape(rows, cols).contiguous(), scale.contiguous(),
                         torch.zeros_like(scale), "i8", GROUP, cols)


def quantize_int4(w: Tensor) -> PackedTensors:
    """w [rows, cols] float -> u4 codes, a float16 scale and bias per group of 32 (its minimum
    and 15 steps to its maximum)."""
    rows, cols = w.shape
    groups = w.float().reshape(rows, cols // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    bias = low.to(torch.float16)
    scale = ((high - bias.float()) / 15).to(torch.float16)
    safe = torch.where(scale > 0, scale.float(), torch.ones(()))
    codes = torch.round((groups - bias.float().unsqueeze(-1)) / safe.unsqueeze(-1))
    codes = codes.clamp_(0, 15).to(torch.uint8)  # [rows, groups, 32]
    u4 = codes[..., :16] | (codes[..., 16:] << 4)  # element i low, element i + 16 high
    return PackedTensors(u4.reshape(rows, cols // 2).contiguous(), scale.contiguous(),
                         bias.contiguous(), "u4", GROUP, cols)


class QuantizedSource:
    """A float checkpoint tensor whose rows read packed (quantized as they are read); read()
    gives the floats unchanged, for whatever is not packed (a shape the layout cannot hold)."""

    def __init__(self, source: Weight, scheme: str) -> None:
        self.source = source
        self.scheme = scheme
        self.shape = shape_of(source)

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        return read_range(self.source, dim, start, stop)

    def read_packed(self, start: int, stop: int) -> PackedTensors | None:
        if len(self.shape) != 2 or self.shape[1] % GROUP:
            return None
        rows = read_range(self.source, 0, start, stop)
        return quantize_int4(rows) if self.scheme == "int4" else quantize_int8(rows)


def quantized_weights(weights: Iterable[tuple[str, Weight]], scheme: str
                      ) -> Iterator[tuple[str, Weight]]:
    """The checkpoint's tensors with the projections, embedding and head wrapped to read packed
    (int4: the embedding and head in int8); experts, routers and norms as they are."""
    for name, weight in weights:
        base = name.rsplit(".", 1)
        if (len(base) == 2 and base[1] == "weight" and ".experts." not in name
                and len(shape_of(weight)) == 2):
            part = base[0].rsplit(".", 1)[-1]
            if part in _PROJECTIONS:
                yield name, QuantizedSource(weight, scheme)
                continue
            if part in _TABLES:
                yield name, QuantizedSource(weight, "int8")
                continue
        yield name, weight
