"""A LoRA adapter's weights as this rank's model multiplies them: per layer and projection, one
A [rank, in] and one B [out, rank] (the scale folded into B), fused the way the decoder fuses
its projections and sharded the way their base weights are (models/parallel.py):

- a fused projection (qkv_proj, gate_up_proj) adapted part by part: the parts' A stacked, B
  block-diagonal (part p's rows take only part p's rank columns); adapted whole (Phi-3's
  checkpoints): its A and B as they are;
- column-parallel (qkv_proj, gate_up_proj): B's rows of each part taken as the base weight's
  (ColumnParallelLinear.rows), A whole; row-parallel (o_proj, down_proj): A's columns taken as
  the base weight's (RowParallelLinear.cols), B whole, so each rank's partial product is summed
  by the all-reduce that sums the base's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import Tensor

from radixrt.runtime.models.lora_format import LORA_MODULES, WEIGHTS_FILE, LoraPair, LoraSpec
from radixrt.runtime.models.parallel import ColumnParallelLinear, RowParallelLinear, take


@dataclass(frozen=True)
class LoraWeights:
    """One adapter on this rank: (layer, module) -> (A [r, in], B [out, r]) in float32."""

    key: str
    pairs: dict[tuple[int, str], tuple[Tensor, Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * 4 + b.numel() * 4 for a, b in self.pairs.values())


def adapted_modules(model: torch.nn.Module) -> dict[tuple[int, str], torch.nn.Module]:
    """The model's projections an adapter may adapt: (layer, module name) -> the layer."""
    found: dict[tuple[int, str], torch.nn.Module] = {}
    for i, layer in enumerate(model.layers):  # type: ignore[union-attr]
        for owner in (layer.self_attn, layer.mlp):
            for name in LORA_MODULES:
                module = getattr(owner, name, None)
                if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                    found[(i, name)] = module
    return found


def load_lora(spec: LoraSpec, key: str, parts: dict[str, list[int]],
              modules: dict[tuple[int, str], torch.nn.Module]) -> LoraWeights:
    """Read the adapter of `spec` (checked by lora_format.read_spec against the model whose
    full part sizes are `parts`) into this rank's pieces."""
    grouped: dict[tuple[int, str], list[LoraPair]] = {}
    for pair in spec.pairs:
        grouped.setdefault((pair.layer, pair.module), []).append(pair)
    out: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
    with safe_open(f"{spec.path}/{WEIGHTS_FILE}", framework="pt") as f:
        for (layer, module), pairs in grouped.items():
            a, b = _fused(f, pairs, parts[module])
            out[(layer, module)] = _shard(modules[(layer, module)], a, b, parts[module])
    return LoraWeights(key, out)


def _fused(f: object, pairs: list[LoraPair], part_rows: list[int]) -> tuple[Tensor, Tensor]:
    """The module's full A [R, in] and B [out, R]: one pair as it is, or the parts' pairs
    stacked / block-diagonal."""
    read = f.get_tensor  # type: ignore[attr-defined]
    if len(pairs) == 1 and pairs[0].part is None:
        p = pairs[0]
        return read(p.a_name).float(), read(p.b_name).float() * p.scale
    pairs = sorted(pairs, key=lambda p: p.part or 0)
    a = torch.cat([read(p.a_name).float() for p in pairs])
    b = torch.zeros(sum(part_rows), a.shape[0])
    col = 0
    for p in pairs:
        assert p.part is not None
        row = sum(part_rows[: p.part])
        b[row : row + part_rows[p.part], col : col + p.rank] = read(p.b_name).float() * p.scale
        col += p.rank
    return a, b


def _shard(module: torch.nn.Module, a: Tensor, b: Tensor,
           part_rows: list[int]) -> tuple[Tensor, Tensor]:
    if isinstance(module, ColumnParallelLinear):
        pieces, start = [], 0
        for rows, full in zip(module.rows, part_rows, strict=True):
            pieces.append(take(b[start : start + full], rows, 0))
            start += full
        return a.contiguous(), torch.cat(pieces).contiguous()
    assert isinstance(module, RowParallelLinear)
    return take(a, module.cols, 1).contiguous(), b.contiguous()
