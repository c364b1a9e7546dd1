"""The mixture-of-experts block: a router picks top_k experts per token, the experts' gated MLPs
run on the tokens routed to them, and their outputs are summed by the routing weights; a shared
expert, scaled by a sigmoid gate (Qwen2-MoE) or not (DeepSeek's shared experts), is added to
every token.

Stages, in order:
1. router logits = x W_r^T (+ b_r)                                   [num_tokens, num_experts]
2. routing (Routing): "softmax_topk" (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V2): softmax over all
   experts in float32, the top_k, renormalised to sum 1 when norm_topk_prob; "topk_softmax"
   (gpt-oss): the top_k logits, then a softmax over them; "sigmoid_topk" (DeepSeek-V3,
   GLM-4.5): sigmoid scores, the top_k of scores + the correction bias, weighted by their
   scores (renormalised when norm_topk_prob). Grouped top-k (n_group > 1) first keeps the
   topk_group best groups of experts; the weights are then times routed_scaling_factor.
                                                             ids, weights [num_tokens, top_k]
3. experts: kernels' fused_moe (the grouped PyTorch reference on the CPU: each expert's product
   once over the tokens routed to it; the Triton fused-MoE kernel on CUDA), activation silu
   (SwiGLU) or gpt-oss's clamped SwiGLU, with biases where the checkpoint has them.
4. under tensor parallelism each rank holds every expert's slice of the intermediate dimension
   (the router replicated), so its output is a partial sum: one all-reduce, as a row-parallel
   layer does; a down bias is added by rank 0 only.

Expert weights are held stacked: gate_up [num_experts, 2 * local_inter, hidden] (gate rows,
then up rows) and down [num_experts, hidden, local_inter]. Checkpoints ship them per expert
(`experts.N.gate_proj.weight`, ... after the family's renames) or stacked as gpt-oss does
(`experts.gate_up_proj` [E, hidden, 2 * inter] with gate and up interleaved, `experts.down_proj`
[E, inter, hidden]); `load` takes either, reading only this rank's intermediate rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.kernels.moe_reference import fused_moe_ref
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.models.layers import GatedMLP
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.parallel import take
from radixrt.runtime.models.tensor_source import Weight, read_all

# per-expert checkpoint tensor -> (our parameter, its part): gate rows, up rows, down
EXPERT_PARTS = {"gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0)}


@dataclass(frozen=True)
class Routing:
    """How the router's logits pick experts (model_config.py's MoE traits)."""

    top_k: int
    kind: str = "softmax_topk"
    renormalize: bool = False
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0

    @classmethod
    def of(cls, config: ModelConfig) -> Routing:
        return cls(config.num_experts_per_tok, config.routing, config.norm_topk_prob,
                   config.n_group, config.topk_group, config.routed_scaling_factor)


def route(logits: Tensor, routing: Routing,
          correction: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """logits [num_tokens, num_experts] -> (ids [num_tokens, top_k] int64, weights float32);
    correction: [num_experts], added to sigmoid scores for the choice only."""
    top_k = routing.top_k
    if routing.kind == "topk_softmax":
        values, ids = torch.topk(logits.float(), top_k, dim=-1)
        return ids, torch.softmax(values, dim=-1)
    sigmoid = routing.kind == "sigmoid_topk"
    probs = logits.float().sigmoid() if sigmoid else torch.softmax(logits.float(), dim=-1)
    choice = probs if correction is None else probs + correction.float()
    if routing.n_group > 1:
        choice = _keep_best_groups(choice, routing, two_best=sigmoid)
    if sigmoid or correction is not None:
        ids = torch.topk(choice, top_k, dim=-1)[1]
        weights = probs.gather(1, ids)
    else:
        weights, ids = torch.topk(choice, top_k, dim=-1)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if sigmoid else 0.0))
    return ids, weights * routing.scaling if routing.scaling != 1.0 else weights


def _keep_best_groups(scores: Tensor, routing: Routing, two_best: bool) -> Tensor:
    """scores [num_tokens, num_experts] with every expert outside the topk_group best of the
    n_group groups masked out (-inf for sigmoid's choice, 0 for softmax probabilities, as
    DeepSeek-V3 and V2 do). A group's score: its two best experts' sum, or its best's."""
    n, experts = scores.shape
    grouped = scores.view(n, routing.n_group, experts // routing.n_group)
    group_scores = (grouped.topk(2, dim=-1)[0].sum(dim=-1) if two_best
                    else grouped.max(dim=-1).values)  # [num_tokens, n_group]
    best = torch.topk(group_scores, routing.topk_group, dim=-1)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(n, experts)
    return scores.masked_fill(~keep, float("-inf") if two_best else 0.0)


class Experts(nn.Module):
    """Every expert's gated MLP over this rank's intermediate rows `rows` (None: padding)."""

    def __init__(self, config: ModelConfig, rows: Sequence[int | None], tp: TPGroup) -> None:
        super().__init__()
        self.rows = list(rows)
        self.num_experts = config.num_experts
        local, hidden = len(self.rows), config.hidden_size
        self.gate_up = nn.Parameter(torch.empty(self.num_experts, 2 * local, hidden))
        self.down = nn.Parameter(torch.empty(self.num_experts, hidden, local))
        self.gate_up_bias: nn.Parameter | None = None
        self.down_bias: nn.Parameter | None = None
        if config.expert_bias:
            self.gate_up_bias = nn.Parameter(torch.empty(self.num_experts, 2 * local))
            self.down_bias = nn.Parameter(torch.empty(self.num_experts, hidden))
        self.activation = config.expert_activation
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit
        self.tp = tp

    def covered(self, attr: str, shards: set[object]) -> bool:
        """Whether the loaded shards cover a parameter: stacked whole (0), or every expert's
        parts (CausalLM.load_weights asks)."""
        if 0 in shards:
            return True
        parts = (0, 1) if attr == "gate_up" else (0,)
        return all((e, p) in shards for e in range(self.num_experts) for p in parts)

    def forward(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        # x: [num_tokens, hidden]; ids, weights: [num_tokens, top_k] -> [num_tokens, hidden]
        down_bias = self.down_bias if self.tp.rank == 0 else None
        kwargs = dict(gate_up_bias=self.gate_up_bias, down_bias=down_bias,
                      activation=self.activation, swiglu_alpha=self.alpha,
                      swiglu_limit=self.limit)
        if x.device.type == "cuda":
            from radixrt.kernels.fused_moe import fused_moe

            return fused_moe(x, self.gate_up, self.down, ids, weights, **kwargs)
        return fused_moe_ref(x, self.gate_up, self.down, ids, weights, **kwargs)

    @torch.no_grad()
    def load(self, shard: object, full: Weight, name: str) -> None:
        """One checkpoint tensor: a per-expert part (shard = (expert, part)) or a stacked
        gpt-oss tensor (shard = 0), narrowed to this rank's rows."""
        local = len(self.rows)
        interleaved = [r if r is None else 2 * r + p for r in self.rows for p in (0, 1)]
        if isinstance(shard, tuple):
            expert, part = shard
            if name == "gate_up":
                piece = take(full, self.rows, 0)  # [local, hidden]
                _copy(self.gate_up.data[expert, part * local : (part + 1) * local], piece)
            else:
                _copy(self.down.data[expert], take(full, self.rows, 1))  # [hidden, local]
            return
        if name == "gate_up":  # [E, hidden, 2 * inter], gate / up interleaved
            both = take(full, interleaved, 2).view(self.num_experts, -1, local, 2)
            _copy(self.gate_up.data, torch.cat([both[..., 0], both[..., 1]], 2).transpose(1, 2))
        elif name == "down":  # [E, inter, hidden]
            _copy(self.down.data, take(full, self.rows, 1).transpose(1, 2))
        elif name == "gate_up_bias" and self.gate_up_bias is not None:  # [E, 2 * inter]
            both = take(full, interleaved, 1).view(self.num_experts, local, 2)
            _copy(self.gate_up_bias.data, torch.cat([both[..., 0], both[..., 1]], 1))
        elif name == "down_bias" and self.down_bias is not None:  # [E, hidden]
            _copy(self.down_bias.data, read_all(full))
        else:
            raise KeyError(f"the experts have no stacked parameter {name!r}")


def _copy(dest: Tensor, piece: Tensor) -> None:
    if tuple(dest.shape) != tuple(piece.shape):
        raise ValueError(f"checkpoint shard of shape {tuple(piece.shape)} does not fit the "
                         f"parameter's {tuple(dest.shape)}")
    dest.copy_(piece)


class MoEBlock(nn.Module):
    """Router, experts and (where the family has one) a shared expert, gated or not; the
    router's score_correction_bias where the family has one (DeepSeek-V3)."""

    def __init__(self, config: ModelConfig, rows: Sequence[int | None],
                 shared_rows: Sequence[int | None], tp: TPGroup) -> None:
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=config.router_bias)
        self.score_correction_bias: nn.Parameter | None = None  # [num_experts]
        if config.score_correction_bias:
            self.score_correction_bias = nn.Parameter(torch.empty(config.num_experts))
        self.experts = Experts(config, rows, tp)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(config.hidden_size, shared_rows, TPGroup.single(),
                                          config.hidden_act)
            if config.shared_expert_gated:
                self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        self.routing = Routing.of(config)
        self.router_float32 = config.router_float32
        self.tp = tp

    def keep_router_float32(self) -> None:
        """The router's weight (and the correction bias) in float32 whatever the model's dtype,
        where the family routes in float32 (transformers keeps them so: a bf16 bias or weight
        moves choices at V3's top-8 of 256 boundary). Called after the model is cast."""
        if self.router_float32:
            self.gate.float()
            if self.score_correction_bias is not None:
                self.score_correction_bias.data = self.score_correction_bias.data.float()

    def forward(self, x: Tensor) -> Tensor:
        # x: [num_tokens, hidden] -> [num_tokens, hidden]
        # (a float32 router's weight is float32: keep_router_float32)
        logits = self.gate(x.float() if self.router_float32 else x)
        ids, weights = route(logits, self.routing, self.score_correction_bias)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)  # this rank's partial sum, like the experts'
            if self.shared_expert_gate is not None:
                shared = F.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return self.tp.all_reduce(out)


def expert_target(name: str) -> tuple[str, object] | None:
    """(parameter name, shard) of an expert tensor name, None when it is not one:
    `layers.N.mlp.experts.E.gate_proj.weight` -> (`layers.N.mlp.experts.gate_up`, (E, 0));
    `layers.N.mlp.experts.gate_up_proj` (stacked) -> (`layers.N.mlp.experts.gate_up`, 0)."""
    head, sep, tail = name.partition(".experts.")
    if not sep:
        return None
    parts = tail.split(".")
    if parts[0].isdigit() and len(parts) == 3 and parts[1] in EXPERT_PARTS:
        param, part = EXPERT_PARTS[parts[1]]
        return f"{head}.experts.{param}", (int(parts[0]), part)
    stacked = {"gate_up_proj": "gate_up", "down_proj": "down",
               "gate_up_proj_bias": "gate_up_bias", "down_proj_bias": "down_bias"}
    if len(parts) == 1 and parts[0] in stacked:
        return f"{head}.experts.{stacked[parts[0]]}", 0
    return None


