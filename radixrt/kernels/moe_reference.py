"""PyTorch reference of the fused mixture-of-experts layer: the CPU path and the oracle of the
Triton kernel (radixrt/kernels/fused_moe.py, same signature).

Conventions shared with the Triton kernel (keep this signature):
- x [num_tokens, hidden]; the experts' weights are stacked: w_gate_up [num_experts, 2 * inter,
  hidden] (rows [0, inter) the gate projection, [inter, 2 * inter) the up projection) and w_down
  [num_experts, hidden, inter], each in nn.Linear's [out, in] layout. gpt-oss ships gate and up
  interleaved: the model's loader splits them into this layout.
- topk_ids [num_tokens, top_k] (int64 or int32, values in [0, num_experts)) and topk_weights
  [num_tokens, top_k] float32 come from the router, already normalised / scaled; a token's
  output is sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]). A (token, k) choice is a
  "pair", numbered t * top_k + k.
- expert_e(x) = down_e(act(gate_e(x) + b_gate, up_e(x) + b_up)) + b_down, biases optional:
    "silu":       act(g, u) = silu(g) * u                                  (SwiGLU)
    "swiglu_oai": act(g, u) = (clamp(u, -l, l) + 1) * g' * sigmoid(alpha * g'),
                  g' = min(g, l), l = swiglu_limit, alpha = swiglu_alpha   (gpt-oss)
- Precision: each expert's products run in x's dtype (PyTorch's matmuls accumulate in float32),
  the activation in float32, and the weighted sum over top_k in float32; the result is cast back
  to x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = ("silu", "swiglu_oai")
DEFAULT_SWIGLU_ALPHA = 1.702  # gpt-oss's config.swiglu_alpha
DEFAULT_SWIGLU_LIMIT = 7.0  # gpt-oss's config.swiglu_limit


def check_moe_args(
    x: Tensor, w_gate_up: Tensor, w_down: Tensor, topk_ids: Tensor, topk_weights: Tensor,
    gate_up_bias: Tensor | None, down_bias: Tensor | None, activation: str,
) -> None:  # fmt: skip
    """The shapes both implementations rely on (values of topk_ids are not checked: that would
    cost the GPU path a host synchronisation)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: use one of {ACTIVATIONS}")
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError("expected x [tokens, hidden], w_gate_up [experts, 2 * inter, hidden], "
                         "w_down [experts, hidden, inter]")  # fmt: skip
    num_experts, two_inter, hidden = w_gate_up.shape
    inter = two_inter // 2
    if x.shape[1] != hidden or two_inter % 2 or tuple(w_down.shape) != (num_experts, hidden, inter):
        raise ValueError(
            f"x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)} and w_down "
            f"{tuple(w_down.shape)} do not fit together"
        )
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise TypeError(f"x {x.dtype}, w_gate_up {w_gate_up.dtype} and w_down {w_down.dtype} "
                        "must share a dtype")  # fmt: skip
    routed = topk_ids.dim() == 2 and topk_ids.shape[0] == x.shape[0]
    if not routed or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)}: expected [num_tokens, top_k]")  # fmt: skip
    if topk_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"topk_ids must be int64 or int32, not {topk_ids.dtype}")
    if gate_up_bias is not None and tuple(gate_up_bias.shape) != (num_experts, two_inter):
        raise ValueError(f"gate_up_bias {tuple(gate_up_bias.shape)}: expected "
                         f"{(num_experts, two_inter)}")  # fmt: skip
    if down_bias is not None and tuple(down_bias.shape) != (num_experts, hidden):
        raise ValueError(f"down_bias {tuple(down_bias.shape)}: expected {(num_experts, hidden)}")


def moe_activation(
    gate: Tensor, up: Tensor, activation: str, swiglu_alpha: float, swiglu_limit: float
) -> Tensor:
    """act(gate, up) for gate, up [rows, inter] float32 (see the module docstring)."""
    if activation == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=swiglu_limit)
    up = up.clamp(-swiglu_limit, swiglu_limit)
    return (up + 1.0) * gate * torch.sigmoid(gate * swiglu_alpha)


def _expert_mlp(
    rows: Tensor, expert: int, w_gate_up: Tensor, w_down: Tensor, gate_up_bias: Tensor | None,
    down_bias: Tensor | None, activation: str, swiglu_alpha: float, swiglu_limit: float,
) -> Tensor:  # fmt: skip
    """One expert on the rows routed to it: rows [count, hidden] -> [count, hidden] float32."""
    inter = w_down.shape[2]
    dtype = rows.dtype
    b_gate_up = None if gate_up_bias is None else gate_up_bias[expert].to(dtype)
    gate_up = F.linear(rows, w_gate_up[expert], b_gate_up).float()  # [count, 2 * inter]
    h = moe_activation(gate_up[:, :inter], gate_up[:, inter:], activation, swiglu_alpha,
                       swiglu_limit)  # [count, inter] float32  # fmt: skip
    out = F.linear(h.to(dtype), w_down[expert]).float()  # [count, hidden]
    if down_bias is not None:
        out += down_bias[expert].float()
    return out


def fused_moe_ref(
    x: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    *,
    gate_up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    activation: str = "silu",
    swiglu_alpha: float = DEFAULT_SWIGLU_ALPHA,
    swiglu_limit: float = DEFAULT_SWIGLU_LIMIT,
) -> Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) -> [num_tokens, hidden], x's dtype.

    Stages, in order:
    1. group the pairs by expert: a stable sort of the pairs' expert ids, and each expert's
       count (bincount), which cuts the sorted pairs into one run per expert;
    2. for each expert with a non-empty run (the others cost nothing): gather its pairs' token
       rows, run its gate_up product once over them, the activation, its down product once
       (plus biases), and scale each row by its pair's routing weight;
    3. index_add_ the scaled rows into a float32 accumulator at their tokens, and cast it to
       x's dtype.
    """
    check_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights, gate_up_bias, down_bias,
                   activation)  # fmt: skip
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out.to(x.dtype)
    pair_experts = topk_ids.reshape(-1).long()  # [num_pairs]
    pair_weights = topk_weights.reshape(-1).float()  # [num_pairs]
    sorted_pairs = torch.argsort(pair_experts, stable=True)  # [num_pairs], grouped by expert
    counts = torch.bincount(pair_experts, minlength=w_gate_up.shape[0]).tolist()  # [num_experts]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = sorted_pairs[start : start + count]  # [count]
        start += count
        tokens = pairs // top_k  # [count]
        rows = x.index_select(0, tokens)  # [count, hidden]
        expert_out = _expert_mlp(rows, expert, w_gate_up, w_down, gate_up_bias, down_bias,
                                 activation, swiglu_alpha, swiglu_limit)  # fmt: skip
        out.index_add_(0, tokens, expert_out * pair_weights[pairs].unsqueeze(1))
    return out.to(x.dtype)
