"""The per-token layer kernels against their PyTorch references: RMSNorm (Llama's, Gemma's 1 + w,
rows of any stride, widths that are not multiples of 16) and act(gate) * up (SiLU, GELU-tanh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.kernels.cpu_norm import act_mul_cpu, rms_norm_cpu
from radixrt.runtime.models.layers import RMSNorm


@pytest.mark.parametrize("dim,offset", [(576, 0.0), (64, 1.0), (100, 0.0)])
def test_rms_norm_equals_the_module(dim: int, offset: float) -> None:
    gen = torch.Generator().manual_seed(dim)
    norm = RMSNorm(dim, 1e-5, offset)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=gen))
    wide = torch.randn(7, dim + 32, generator=gen) * 3
    x = wide[:, :dim]  # rows with a stride
    got = rms_norm_cpu(x, norm.weight.data, 1e-5, offset)
    assert got is not None and got.shape == (7, dim)
    torch.testing.assert_close(got, norm(x), rtol=1e-6, atol=1e-6)
    heads = torch.randn(3, 4, dim, generator=gen)  # [tokens, heads, dim]: every head a row
    torch.testing.assert_close(rms_norm_cpu(heads, norm.weight.data, 1e-5, offset),
                               norm(heads), rtol=1e-6, atol=1e-6)
    norm.native = True  # the module's own switch to the kernel
    torch.testing.assert_close(norm(x), got, rtol=0, atol=0)


@pytest.mark.parametrize("act,ref", [("silu", F.silu),
                                     ("gelu_tanh", lambda g: F.gelu(g, approximate="tanh"))])
@pytest.mark.parametrize("inter", [1536, 40])
def test_act_mul_equals_the_reference(act: str, ref, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(5, 2 * inter, generator=gen) * 4
    gate_up[0, :8] = torch.tensor([-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 90.0, 200.0])
    got = act_mul_cpu(gate_up, act)
    gate, up = gate_up.split(inter, dim=-1)
    assert got is not None
    torch.testing.assert_close(got, ref(gate) * up, rtol=2e-6, atol=5e-6)  # |gate * up| ~ 16
    assert act_mul_cpu(gate_up, "gelu") is None  # the erf form: the module's own path


@pytest.mark.parametrize("cols", [49152, 100, 7])
def test_argmax_lse_equals_torchs_argmax_and_logsumexp(cols: int) -> None:
    from radixrt.kernels.cpu_norm import argmax_lse_cpu

    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(6, cols, generator=gen) * 4
    x[1, cols // 2] = x[1, 3] = x[1].max() + 1  # a tie: the first maximum
    x[2] = float("-inf")
    x[3, cols - 1] = float("inf")
    x[4, cols // 3] = float("nan")
    index, lse = argmax_lse_cpu(x)
    assert torch.equal(index, x.argmax(dim=-1))
    torch.testing.assert_close(lse, x.logsumexp(dim=-1), rtol=1e-6, atol=1e-5, equal_nan=True)
    assert argmax_lse_cpu(x[:, ::2]) is None and argmax_lse_cpu(x.double()) is None
