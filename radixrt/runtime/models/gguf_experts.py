"""A GGUF's stacked expert tensors, read expert by expert under the names the decoder loads.

llama.cpp's converter stacks every expert's projection of a layer into one tensor (torch
order): `ffn_gate_exps` / `ffn_up_exps` [E, inter, hidden] and `ffn_down_exps` [E, hidden,
inter], each expert's HF weight torch.stack'ed (Mixtral's w1 / w3 / w2, Qwen-MoE's and OLMoE's
gate / up / down_proj); with --fuse-gate-up-exps one `ffn_gate_up_exps` [E, 2 * inter, hidden],
gate rows then up rows. For gpt-oss it de-interleaves HF's `gate_up_proj` [E, hidden, 2 * inter]
(gate and up alternate by column) into the same transposed `ffn_gate_exps` / `ffn_up_exps`,
transposes `down_proj` [E, inter, hidden] into `ffn_down_exps`, and splits the biases the same
way: `ffn_gate_exps.bias` / `ffn_up_exps.bias` [E, inter] (or one `ffn_gate_up_exps.bias`, gate
then up) and `ffn_down_exps.bias` [E, hidden]. Real gpt-oss files hold the expert weights in
MXFP4 (dequantized by models/gguf_quants.py).

That is not the stacked layout moe.Experts.load takes (gpt-oss's HF one), so each expert's
projection is yielded on its own under its per-expert name (`mlp.experts.E.gate_proj.weight`,
as moe.expert_target maps it), as an ExpertRows view: a tensor-parallel rank dequantizes only
its rows of each expert (a row of a quantized tensor is whole blocks: ggml requires it). The
biases are small: they are read whole and yielded stacked, gate and up interleaved as
Experts.load takes them (`mlp.experts.gate_up_proj_bias`, `mlp.experts.down_proj_bias`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from radixrt.runtime.models.gguf_file import GGUFFile
from radixrt.runtime.models.tensor_source import Weight

# stacked GGUF tensor -> the per-expert projections it holds, in row order
STACKED_PARTS = {
    "ffn_gate_exps": ("gate_proj",),
    "ffn_up_exps": ("up_proj",),
    "ffn_down_exps": ("down_proj",),
    "ffn_gate_up_exps": ("gate_proj", "up_proj"),
}


class ExpertRows:
    """Rows [start, stop) of one expert of a stacked GGUF tensor [E, R, C], as a TensorSource
    of shape [stop - start, C]; a range of its rows is dequantized alone."""

    def __init__(self, gf: GGUFFile, name: str, expert: int, start: int, stop: int) -> None:
        experts, rows, cols = gf.tensors[name].shape
        if not (0 <= expert < experts and 0 <= start < stop <= rows):
            raise ValueError(f"{name}: expert {expert}, rows [{start}, {stop}) are outside its "
                             f"shape {(experts, rows, cols)}")
        self.gf = gf
        self.name = name
        self.first = expert * rows + start  # in the tensor seen as [E * R, C]
        self.shape = (stop - start, cols)

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        if dim == 0:
            return self.gf.flat_rows(self.name, self.first + start, self.first + stop)
        whole = self.gf.flat_rows(self.name, self.first, self.first + self.shape[0])
        return whole.narrow(dim, start, stop - start)


def split_name(name: str) -> tuple[int, str, str] | None:
    """(layer, part, suffix) of a stacked expert tensor's name ("blk.3.ffn_up_exps.weight"),
    None for any other tensor."""
    pieces = name.split(".")
    if len(pieces) != 4 or pieces[0] != "blk" or pieces[2] not in STACKED_PARTS:
        return None
    return int(pieces[1]), pieces[2], pieces[3]


def expert_tensors(gf: GGUFFile, name: str, num_experts: int) -> Iterator[tuple[str, Weight]]:
    """The HF-named tensors of one stacked expert tensor of the file: per-expert weight views,
    or a stacked bias (ffn_up_exps.bias is yielded with ffn_gate_exps.bias, interleaved)."""
    split = split_name(name)
    if split is None:
        raise ValueError(f"{name!r} is not a stacked expert tensor")
    layer, part, suffix = split
    shape = gf.tensors[name].shape
    if shape[0] != num_experts:
        raise ValueError(f"{name} stacks {shape[0]} experts; the file's expert_count is "
                         f"{num_experts}")
    prefix = f"model.layers.{layer}.mlp.experts"
    if suffix == "weight":
        yield from _expert_weights(gf, name, prefix, STACKED_PARTS[part])
    elif suffix != "bias":
        raise ValueError(f"the GGUF has a tensor {name!r}, which radixrt does not use: "
                         "not supported")
    elif part == "ffn_down_exps":
        yield f"{prefix}.down_proj_bias", gf.tensor(name)
    elif part != "ffn_up_exps":  # gate, or fused gate / up
        yield f"{prefix}.gate_up_proj_bias", _gate_up_bias(gf, layer, part)
    elif f"blk.{layer}.ffn_gate_exps.bias" not in gf.tensors:
        raise ValueError(f"the GGUF has {name} but no blk.{layer}.ffn_gate_exps.bias")


def _expert_weights(gf: GGUFFile, name: str, prefix: str,
                    parts: tuple[str, ...]) -> Iterator[tuple[str, Weight]]:
    if len(gf.tensors[name].shape) != 3:
        raise ValueError(f"{name} of shape {gf.tensors[name].shape}: expected [experts, rows, "
                         "columns]")
    experts, rows, _ = gf.tensors[name].shape
    if rows % len(parts):
        raise ValueError(f"{name} of shape {gf.tensors[name].shape} does not split into "
                         f"{len(parts)} equal parts")
    size = rows // len(parts)
    for expert in range(experts):
        for i, proj in enumerate(parts):
            view = ExpertRows(gf, name, expert, i * size, (i + 1) * size)
            yield f"{prefix}.{expert}.{proj}.weight", view


def _gate_up_bias(gf: GGUFFile, layer: int, part: str) -> Tensor:
    """[E, 2 * inter] with gate and up alternating by column, as gpt-oss's HF bias is."""
    if part == "ffn_gate_up_exps":
        fused = gf.tensor(f"blk.{layer}.ffn_gate_up_exps.bias")  # [E, 2 * inter]: gate, up
        gate, up = fused.chunk(2, dim=1)
    else:
        up_name = f"blk.{layer}.ffn_up_exps.bias"
        if up_name not in gf.tensors:
            raise ValueError(f"the GGUF has blk.{layer}.ffn_gate_exps.bias but no {up_name}")
        gate, up = gf.tensor(f"blk.{layer}.ffn_gate_exps.bias"), gf.tensor(up_name)
    if gate.shape != up.shape:
        raise ValueError(f"layer {layer}'s expert gate and up biases differ in shape "
                         f"({tuple(gate.shape)}, {tuple(up.shape)})")
    return torch.stack([gate, up], dim=2).reshape(gate.shape[0], -1)


def shared_expert_gate(gf: GGUFFile, name: str) -> Tensor:
    """Qwen2-MoE's shared-expert gate as HF's [1, hidden]: converters that squeezed tensors
    wrote it [hidden] (llama.cpp reads either as {n_embd})."""
    return gf.tensor(name).reshape(1, -1)
