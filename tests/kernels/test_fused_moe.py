"""The fused mixture-of-experts layer: the PyTorch reference (the CPU path) against a naive
per-token loop and against transformers' gpt-oss experts; the Triton kernel against the
reference (in Triton's CPU interpreter without CUDA); its align step; its sm_90 compilation.

Every case routes tokens to a random subset of the experts, so some experts get no token, and
fills those experts' weights with NaN: an implementation that reads an expert nobody chose
into any output fails.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from test_extend_attention import (  # noqa: E402
    DEVICE,
    _compile_for_hopper,
    _LaunchRecorder,
    compile_module_for_hopper,
)
from torch import Tensor  # noqa: E402

from radixrt.kernels import fused_moe as moe_mod  # noqa: E402
from radixrt.kernels import triton_utils  # noqa: E402
from radixrt.kernels.fused_moe import align_pairs_to_blocks, fused_moe  # noqa: E402
from radixrt.kernels.moe_reference import fused_moe_ref  # noqa: E402

# max |out - expected| / max |expected|: the reference against the float64 loop, and the kernel
# against the reference (which rounds gate/up to x's dtype before the activation; the kernel
# applies it to its float32 accumulators). Triton's interpreter truncates float32 -> bfloat16
# where the GPU rounds to nearest, which about doubles the kernel's bfloat16 error there.
REF_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
KERNEL_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.5e-2, torch.float16: 2e-3}
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 1.5  # a limit low enough that the clamps bite


@dataclass(frozen=True)
class Case:
    num_experts: int
    top_k: int
    hidden: int
    inter: int
    num_tokens: int
    dtype: torch.dtype
    activation: str = "silu"
    bias: bool = False
    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None

    def __str__(self) -> str:
        blocks = "".join(f"-{n}{v}" for n, v in zip("mnk", (self.block_m, self.block_n,
                                                           self.block_k)) if v)  # fmt: skip
        return (f"E{self.num_experts}-k{self.top_k}-h{self.hidden}-i{self.inter}-"
                f"t{self.num_tokens}-{str(self.dtype)[6:]}-{self.activation}"
                f"{'-bias' if self.bias else ''}{blocks}")  # fmt: skip


def make_inputs(case: Case, seed: int) -> tuple[tuple[Tensor, ...], dict[str, Any]]:
    """(x, w_gate_up, w_down, topk_ids, topk_weights), keywords. Tokens choose among a random
    three quarters of the experts (at least top_k); the others' weights and biases are NaN."""
    gen = torch.Generator().manual_seed(seed)
    num_e, k, hidden, inter, tokens = (case.num_experts, case.top_k, case.hidden, case.inter,
                                       case.num_tokens)  # fmt: skip
    active = torch.randperm(num_e, generator=gen)[: max(k, num_e * 3 // 4)]  # [num_active]
    choice = torch.rand(tokens, active.numel(), generator=gen).argsort(1)[:, :k]
    topk_ids = active[choice]  # [tokens, k], distinct experts per token
    topk_ids = topk_ids.to(torch.int32 if seed % 2 else torch.int64)
    topk_weights = torch.softmax(torch.randn(tokens, k, generator=gen), 1)  # [tokens, k]
    unused = torch.ones(num_e, dtype=torch.bool)
    unused[active] = False

    def weight(*shape: int, scale: float) -> Tensor:
        w = torch.randn(*shape, generator=gen) * scale
        w[unused] = float("nan")
        return w.to(DEVICE, case.dtype)

    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, case.dtype)
    w_gate_up = weight(num_e, 2 * inter, hidden, scale=2 * hidden**-0.5)
    w_down = weight(num_e, hidden, inter, scale=inter**-0.5)
    kwargs: dict[str, Any] = {"activation": case.activation, "swiglu_alpha": SWIGLU_ALPHA,
                              "swiglu_limit": SWIGLU_LIMIT}  # fmt: skip
    if case.bias:
        kwargs["gate_up_bias"] = weight(num_e, 2 * inter, scale=0.5)
        kwargs["down_bias"] = weight(num_e, hidden, scale=0.5)
    ids, weights = topk_ids.to(DEVICE), topk_weights.to(DEVICE)
    return (x, w_gate_up, w_down, ids, weights), kwargs


def naive_moe(x: Tensor, w_gate_up: Tensor, w_down: Tensor, topk_ids: Tensor,
              topk_weights: Tensor, **kw: Any) -> Tensor:  # fmt: skip
    """The layer token by token, choice by choice, in float64: [num_tokens, hidden]."""
    inter = w_down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            gate_up = w_gate_up[e].double().cpu() @ x[t].double().cpu()  # [2 * inter]
            if kw.get("gate_up_bias") is not None:
                gate_up += kw["gate_up_bias"][e].double().cpu()
            gate, up = gate_up[:inter], gate_up[inter:]
            if kw["activation"] == "silu":
                h = gate / (1 + torch.exp(-gate)) * up
            else:
                gate = torch.minimum(gate, torch.tensor(kw["swiglu_limit"]).double())
                up = torch.clamp(up, -kw["swiglu_limit"], kw["swiglu_limit"])
                h = (up + 1) * gate / (1 + torch.exp(-kw["swiglu_alpha"] * gate))
            y = w_down[e].double().cpu() @ h  # [hidden]
            if kw.get("down_bias") is not None:
                y += kw["down_bias"][e].double().cpu()
            out[t] += float(topk_weights[t, k]) * y
    return out


def rel_err(out: Tensor, expected: Tensor) -> float:
    out, expected = out.double().cpu(), expected.double().cpu()
    if not bool(out.isfinite().all()):
        return float("inf")
    return float((out - expected).abs().max() / expected.abs().max())


# --- the reference ---------------------------------------------------------------------------

REF_CASES = [
    Case(8, top_k, 64, 24, 13, dtype, activation, bias)
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
    for activation in ("silu", "swiglu_oai")
    for bias in (False, True)
    for top_k in (1, 3)
]


@pytest.mark.parametrize("case", REF_CASES, ids=str)
def test_reference_matches_naive_loop(case: Case) -> None:
    args, kwargs = make_inputs(case, seed=REF_CASES.index(case))
    out = fused_moe_ref(*args, **kwargs)
    assert out.dtype == case.dtype and out.shape == (case.num_tokens, case.hidden)
    assert rel_err(out, naive_moe(*args, **kwargs)) < REF_TOLERANCE[case.dtype]


def test_reference_runs_each_chosen_expert_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two products per chosen expert, each over all of its pairs' rows; none for the others."""
    case = Case(16, 4, 64, 32, 40, torch.float32, bias=True)
    args, kwargs = make_inputs(case, seed=3)
    rows_per_call: list[int] = []
    linear = F.linear

    def counting_linear(inp: Tensor, *rest: Any) -> Tensor:
        rows_per_call.append(inp.shape[0])
        return linear(inp, *rest)

    monkeypatch.setattr(F, "linear", counting_linear)
    fused_moe_ref(*args, **kwargs)
    counts = torch.bincount(args[3].reshape(-1).long(), minlength=case.num_experts)
    chosen = counts[counts > 0].tolist()
    assert rows_per_call == [n for n in chosen for _ in range(2)]


def test_reference_matches_transformers_gpt_oss_experts() -> None:
    """swiglu_oai with biases equals GptOssExperts (gate and up interleaved there)."""
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    num_e, k, hidden, inter, tokens = 8, 2, 32, 16, 9
    config = GptOssConfig(hidden_size=hidden, intermediate_size=inter, num_local_experts=num_e,
                          num_experts_per_tok=k, swiglu_limit=SWIGLU_LIMIT)  # fmt: skip
    experts = GptOssExperts(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    x = torch.randn(tokens, hidden, generator=gen)
    ids = torch.rand(tokens, num_e, generator=gen).argsort(1)[:, :k]  # [tokens, k]
    weights = torch.softmax(torch.randn(tokens, k, generator=gen), 1)  # [tokens, k]
    with torch.no_grad():
        expected = experts(x, ids, weights)
        gate_up = experts.gate_up_proj.transpose(1, 2)  # [E, 2 * inter, hidden], interleaved
        w_gate_up = torch.cat([gate_up[:, ::2], gate_up[:, 1::2]], 1)  # gate rows, up rows
        b = experts.gate_up_proj_bias
        out = fused_moe_ref(
            x, w_gate_up.contiguous(), experts.down_proj.transpose(1, 2).contiguous(), ids,
            weights, gate_up_bias=torch.cat([b[:, ::2], b[:, 1::2]], 1),
            down_bias=experts.down_proj_bias, activation="swiglu_oai",
            swiglu_alpha=config.swiglu_alpha, swiglu_limit=config.swiglu_limit,
        )  # fmt: skip
    assert rel_err(out, expected) < 1e-5


def test_no_tokens_and_bad_arguments() -> None:
    args, kwargs = make_inputs(Case(8, 2, 64, 16, 0, torch.float32), seed=0)
    for fn in (fused_moe_ref, fused_moe):
        assert fn(*args, **kwargs).shape == (0, 64)
    args, kwargs = make_inputs(Case(8, 2, 64, 16, 3, torch.float32), seed=0)
    with pytest.raises(ValueError, match="activation"):
        fused_moe_ref(*args, activation="gelu")
    with pytest.raises(ValueError, match="do not fit"):
        fused_moe_ref(args[0], args[1], args[2][:, :, :8], *args[3:])
    with pytest.raises(ValueError, match="top_k"):
        fused_moe_ref(*args[:3], args[3], args[4][:, :1])


# --- the Triton kernel -----------------------------------------------------------------------

KERNEL_CASES = [
    Case(8, 2, 64, 32, 1, torch.float32),  # decode: six of eight experts idle
    Case(8, 1, 64, 48, 37, torch.bfloat16, "swiglu_oai", True),  # top_k 1, inter not 2^n
    Case(16, 4, 96, 32, 5, torch.float16, "silu", True),  # hidden not 2^n
    Case(32, 8, 128, 64, 64, torch.float32, "swiglu_oai", True, block_m=16),
    Case(64, 6, 256, 32, 130, torch.bfloat16),
    Case(128, 8, 512, 32, 300, torch.float16, "swiglu_oai", True),  # 2400 pairs
    Case(128, 1, 512, 16, 3, torch.bfloat16),  # decode over many experts
    Case(60, 4, 192, 80, 30, torch.float32, "silu", True, 32, 32, 32),  # loops over n and k
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=str)
def test_kernel_matches_reference(case: Case) -> None:
    args, kwargs = make_inputs(case, seed=KERNEL_CASES.index(case))
    blocks = {"block_m": case.block_m, "block_n": case.block_n, "block_k": case.block_k}
    out = fused_moe(*args, **kwargs, **blocks)
    assert out.dtype == case.dtype and out.shape == (case.num_tokens, case.hidden)
    assert rel_err(out, fused_moe_ref(*args, **kwargs)) < KERNEL_TOLERANCE[case.dtype]


@pytest.mark.parametrize("block_m", [16, 64])
def test_align_pairs_to_blocks(block_m: int) -> None:
    num_e, top_k, tokens = 12, 3, 50
    ids = torch.rand(tokens, num_e, generator=torch.Generator().manual_seed(block_m))
    ids = ids.argsort(1)[:, :top_k] % 9  # experts 9-11 idle; a token may repeat an expert
    sorted_pairs, block_experts = align_pairs_to_blocks(ids, num_e, block_m)
    num_pairs = tokens * top_k
    assert sorted_pairs.numel() == block_experts.numel() * block_m
    assert block_experts.numel() * block_m >= num_pairs + 9 * (block_m - 1)
    rows = sorted_pairs.view(-1, block_m).long()  # [num_blocks, block_m]
    real = rows < num_pairs
    assert sorted(rows[real].tolist()) == list(range(num_pairs))  # each pair once
    flat = ids.reshape(-1)
    for block, expert in enumerate(block_experts.tolist()):
        if expert == num_e:  # past the padded count: only padding from here on
            assert not real[block:].any()
            break
        assert real[block, 0]  # a block never starts with padding
        assert (flat[rows[block][real[block]]] == expert).all()
    used = block_experts[block_experts < num_e]
    assert torch.equal(used.unique(), flat.unique().int())
    counts = torch.bincount(flat, minlength=num_e)  # blocks per expert: ceil(count / block_m)
    blocks_per_expert = torch.bincount(used.long(), minlength=num_e)
    assert torch.equal(blocks_per_expert, (counts + block_m - 1) // block_m)


# --- GPU code generation, checked on the CPU -------------------------------------------------

HOPPER_LAUNCHES = 8


def compile_launches_for_hopper() -> None:
    """Run the launcher with its GPU settings (bfloat16 decode-sized, float16 with biases and
    gpt-oss's activation at block_m 64, float32 'ieee' dots), recording instead of launching,
    and compile every launch for sm_90. Needs TRITON_INTERPRET=0 (see test_extend_attention)."""
    assert not triton_utils.interpreting(), "run with TRITON_INTERPRET=0"
    calls: list = []
    for name in ("_gate_up_kernel", "_down_kernel"):
        setattr(moe_mod, name, _LaunchRecorder(getattr(moe_mod, name), calls))
    cases = (Case(128, 8, 256, 96, 2, torch.bfloat16),
             Case(8, 2, 256, 96, 300, torch.float16, "swiglu_oai", True),  # block_m 64
             Case(16, 4, 128, 64, 8, torch.float32, "silu", True),
             Case(16, 4, 128, 64, 8, torch.bfloat16, block_m=32))  # fmt: skip
    for case in cases:
        args, kwargs = make_inputs(case, seed=0)
        fused_moe(*args, **kwargs, block_m=case.block_m)
    assert len(calls) == HOPPER_LAUNCHES, len(calls)
    for kernel, args, kwargs in calls:
        _compile_for_hopper(kernel, args, kwargs)
    print(f"compiled {len(calls)} launches for sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the native tests above compile them")
def test_fused_moe_kernels_compile_for_hopper() -> None:
    """The launcher's GPU settings (block sizes, bfloat16/float16 dots, float32 'ieee' dots,
    biases, both activations) compile for sm_90: catches what the interpreter lets through."""
    compile_module_for_hopper("test_fused_moe", HOPPER_LAUNCHES)
