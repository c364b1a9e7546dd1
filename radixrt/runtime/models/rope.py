"""Rotary position embeddings: every RoPE kind the supported families use, one module.

A kind turns (head_dim, theta, scaling) into inverse frequencies over the rotated dimensions and
an attention factor that multiplies cos and sin (1 for all but YaRN and LongRoPE):

- default: theta ** (-2i / rotary_dim).
- linear: positions divided by `factor` (inverse frequencies divided by it).
- llama3: Llama 3.1's wavelength-dependent slow-down with a smooth ramp.
- freq_factors: llama.cpp's rope_freqs tensor, each inverse frequency divided by its factor.
- yarn: interpolation for long wavelengths, extrapolation for short, a linear ramp between the
  correction dimensions of beta_fast / beta_slow; attention factor 0.1 ln(factor) + 1 (or from
  mscale / mscale_all_dim, or given).
- longrope (alias su): per-frequency factors; transformers uses `short_factor` while a sequence
  fits in original_max_position_embeddings and `long_factor` past it, recomputing every position.
  A server cannot re-rotate cached keys, so here the factors are fixed per served context, as
  llama.cpp does: `long_factor` when the context served (the model's positions unless given)
  exceeds the original one, else `short_factor`. Either way a sequence that fits the choice is
  exact with transformers (docs/models.md says this).

Partial rotary (Phi-4-mini, partial_rotary_factor < 1) rotates the first rotary_dim dimensions of
each head and passes the rest through. The layout is rotate-half (NeoX / transformers), or
neighbouring pairs (apply_rotary_interleaved: DeepSeek's latent attention).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

ROPE_TYPES = ("default", "linear", "llama3", "freq_factors", "yarn", "longrope")
_ALIASES = {"su": "longrope"}
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    kind = str((scaling or {}).get("rope_type", "default"))
    return _ALIASES.get(kind, kind)


def rope_parameters(rotary_dim: int, theta: float, scaling: Mapping[str, Any] | None,
                    max_positions: int, served: int | None = None) -> tuple[Tensor, float]:
    """([rotary_dim // 2] float32 inverse frequencies, attention factor). served: the context
    length served, where known (LongRoPE's choice of factors; else max_positions)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (theta**exponents)  # [rotary_dim // 2]
    kind = rope_type_of(scaling)
    if kind == "default":
        return inv_freq, 1.0
    assert scaling is not None
    if kind == "freq_factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float32), 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_scaled(inv_freq, float(scaling["factor"]), scaling), 1.0
    if kind == "yarn":
        return _yarn(rotary_dim, theta, scaling, max_positions)
    if kind == "longrope":
        return _longrope(rotary_dim, theta, scaling, max_positions, served or max_positions)
    raise ValueError(f"rope_type {kind!r} is not supported; use one of {ROPE_TYPES}")


def _llama3_scaled(inv_freq: Tensor, factor: float, scaling: Mapping[str, Any]) -> Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short kept, a smooth ramp between."""
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    original_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = original_len / low_freq_factor  # longer than this: fully scaled
    high_freq_wavelen = original_len / high_freq_factor  # shorter than this: unscaled
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    ramp = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - ramp) * scaled / factor + ramp * scaled
    in_between = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_between, blended, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for an extension by `scale` (1 when not extended)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _extension(scaling: Mapping[str, Any], max_positions: int) -> tuple[int, float, Any]:
    """(original context, extension factor, the given attention factor or None) of a YaRN or
    LongRoPE scaling: the factor defaults to the model's positions over the original ones."""
    original = int(scaling.get("original_max_position_embeddings") or max_positions)
    factor = float(scaling.get("factor") or max_positions / original)
    return original, factor, scaling.get("attention_factor")


def _yarn(rotary_dim: int, theta: float, scaling: Mapping[str, Any],
          max_positions: int) -> tuple[Tensor, float]:
    original, factor, attention_factor = _extension(scaling, max_positions)
    if attention_factor is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = float(scaling.get("beta_fast") or YARN_BETA_FAST)
    beta_slow = float(scaling.get("beta_slow") or YARN_BETA_SLOW)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency; 0: interpolate
    pos_freqs = theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    interpolated, extrapolated = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
    inv_freq = interpolated * (1 - extrapolation) + extrapolated * extrapolation
    return inv_freq, float(attention_factor)


def _longrope(rotary_dim: int, theta: float, scaling: Mapping[str, Any],
              max_positions: int, served: int) -> tuple[Tensor, float]:
    original, factor, attention_factor = _extension(scaling, max_positions)
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1.0
                            else math.sqrt(1 + math.log(factor) / math.log(original)))
    long = min(served, max_positions) > original
    factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    if factors.numel() != rotary_dim // 2:
        raise ValueError(f"longrope has {factors.numel()} factors; the rotary dimension "
                         f"{rotary_dim} needs {rotary_dim // 2}")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (factors * theta**exponents), float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Rotate-half rotary embedding over the first rotary_dim dimensions of each head."""

    def __init__(self, rotary_dim: int, theta: float, scaling: Mapping[str, Any] | None,
                 max_positions: int = 4096, served: int | None = None) -> None:
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"the rotary dimension {rotary_dim} must be even")
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.scaling = dict(scaling) if scaling else None
        self.max_positions = max_positions
        self.served = served
        inv_freq, self.attention_factor = rope_parameters(rotary_dim, theta, scaling,
                                                          max_positions, served)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def materialize(self, device: torch.device) -> None:
        """Recompute inv_freq (float32) on device, e.g. after building on the meta device."""
        inv_freq, _ = rope_parameters(self.rotary_dim, self.theta, self.scaling,
                                      self.max_positions, self.served)
        self.inv_freq = inv_freq.to(device)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [num_tokens] -> cos, sin [num_tokens, 1, rotary_dim // 2] in dtype."""
        freqs = positions.float().unsqueeze(1) * self.inv_freq.float().unsqueeze(0)
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)

    def cos_sin_sections(self, positions: Tensor, sections: tuple[int, ...],
                         dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Multimodal RoPE: positions [3, num_tokens] (temporal, height, width) -> cos, sin
        [num_tokens, 1, rotary_dim // 2], the frequencies in `sections` (summing to
        rotary_dim // 2) taking their positions from stream 0, 1, 2, 0, ... in turn."""
        if sum(sections) != self.inv_freq.numel():
            raise ValueError(f"mrope_section {sections} does not cover the "
                             f"{self.inv_freq.numel()} rotary frequencies")
        stream = torch.cat([torch.full((n,), i % 3, dtype=torch.int64)
                            for i, n in enumerate(sections)]).to(positions.device)
        # each frequency's position: [num_tokens, rotary_dim // 2]
        chosen = positions.t().gather(1, stream.unsqueeze(0).expand(positions.shape[1], -1))
        freqs = chosen.float() * self.inv_freq.float().unsqueeze(0)
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [num_tokens, heads, head_dim]; cos, sin [num_tokens, 1, rotary_dim // 2]: the first
    rotary_dim dimensions rotated (rotate-half), the rest passed through."""
    rotary_dim = cos.shape[-1] * 2
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    x1, x2 = rot[..., :half], rot[..., half:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)


def apply_rotary_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """apply_rotary with the rotated dimensions paired as neighbours (x0, x1), (x2, x3), ...
    (DeepSeek's layout, transformers' view_as_complex form): pair i turns by frequency i.
    x [num_tokens, heads, rotary_dim] (all of it rotated); cos, sin [num_tokens, 1,
    rotary_dim // 2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
