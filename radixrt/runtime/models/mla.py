"""Multi-head latent attention (DeepSeek-V2 / V3, Kimi K2): every token caches one latent row,
not per-head keys and values.

Per token x (hidden):
    q      = q_b(norm(q_a(x)))  or  q_b(x)  (V2-Lite)             [heads, nope + rope]
    c, k_r = kv_a_proj_with_mqa(x) split                          [rank], [rope]
    c      = kv_a_layernorm(c)                                    the latent
    k_r    = rotary(k_r)                                          one rotary key for all heads
    key_h  = [W_UK_h c, k_r], value_h = W_UV_h c   (kv_b_proj's rows of head h: nope, then v)
The cache holds [c, k_r] (kv_lora_rank + qk_rope_head_dim: 512 + 64 for V3) per token and
layer, whatever the head count.

Attention runs in the absorbed form, prefill and decode alike: q_h . key_h = (W_UK_h^T q_nope_h)
. c + q_rope_h . k_r, so each head's query becomes [W_UK_h^T q_nope_h, q_rope_h] against the
cached rows as keys of a single KV head, and sum_j p_j value_h(j) = W_UV_h (sum_j p_j c_j), so
the attention's output over the latent (the cached rows' first kv_lora_rank dims: the layer's
value_dim, LayerAttention) is projected by W_UV_h afterwards. The backend reads the latent
cache only, never expanded keys or values; `expanded_attention` below is the textbook form the
tests hold it to. The softmax scale is (nope + rope) ** -0.5 times YaRN's mscale squared
(the family's attention_scale).

Under tensor parallelism a rank holds some of the heads (the query and kv_b rows, the o_proj
columns of its heads, ShardPlan.q_heads) and the whole latent: the down-projections and the
cache are replicated on every rank (as SGLang does: the cache is one head; splitting its
576 dims would need a collective inside every attention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.models.layers import RMSNorm
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.parallel import ColumnParallelLinear, RowParallelLinear
from radixrt.runtime.models.rope import apply_rotary, apply_rotary_interleaved
from radixrt.runtime.models.shard_plan import ShardPlan, head_rows

# the latent and query-compression norms' epsilon: DeepSeek's (and transformers') default, not
# the config's rms_norm_eps
LATENT_NORM_EPS = 1e-6

if TYPE_CHECKING:
    from radixrt.runtime.forward.attention.base import AttentionBackend
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache


class LatentAttention(nn.Module):
    """MLA over this rank's query heads and the whole latent cache (see the module doc)."""

    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend,
                 shard: ShardPlan, tp: TPGroup, packed: bool = False) -> None:
        super().__init__()
        self.backend = backend
        self.rank, self.rope = config.kv_lora_rank, config.qk_rope_head_dim
        self.nope, self.v_dim = config.qk_nope_head_dim, config.v_head_dim
        self.num_heads = shard.num_heads
        scale = config.attention_scale or config.head_dim**-0.5  # over nope + rope, not rank
        self.spec = LayerAttention(layer_id, scale, value_dim=self.rank)
        heads, hidden, qk = list(shard.q_heads), config.hidden_size, config.head_dim
        bias = config.attention_bias
        self.q_a_proj: ColumnParallelLinear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        q_in = hidden
        if config.q_lora_rank:
            q_in = config.q_lora_rank
            self.q_a_proj = ColumnParallelLinear(hidden, [list(range(q_in))], bias,
                                                 packed=packed)
            self.q_a_layernorm = RMSNorm(q_in, LATENT_NORM_EPS)
        # the heads' queries, from q_a's normed latent, or from x where there is none (V2-Lite:
        # its checkpoint's q_proj, renamed by the family)
        self.q_b_proj = ColumnParallelLinear(q_in, [head_rows(heads, qk)], False, packed=packed)
        self.kv_a_proj_with_mqa = ColumnParallelLinear(
            hidden, [list(range(self.rank + self.rope))], bias, packed=packed)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS)
        # floats whatever the checkpoint: its rows are folded into the query and the output
        self.kv_b_proj = ColumnParallelLinear(self.rank, [head_rows(heads, self.nope + self.v_dim)],
                                              False)
        self.o_proj = RowParallelLinear(head_rows(heads, self.v_dim), hidden, tp,
                                        bias=config.o_proj_bias, packed=packed)
        self.rotate = apply_rotary_interleaved if config.rope_interleave else apply_rotary

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor] | None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """x [n, hidden] -> q_nope [n, heads, nope], q_rope [n, heads, rope] (rotated) and the
        rows to cache [n, 1, rank + rope]: the normed latent and the rotated key."""
        n = x.shape[0]
        q_in = x if self.q_a_proj is None or self.q_a_layernorm is None else (
            self.q_a_layernorm(self.q_a_proj(x)))
        q = self.q_b_proj(q_in).view(n, self.num_heads, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        k_rope = k_rope.reshape(n, 1, self.rope)
        if rope is not None:
            q_rope, k_rope = self.rotate(q_rope, *rope), self.rotate(k_rope, *rope)
        cached = torch.cat([self.kv_a_layernorm(latent).unsqueeze(1), k_rope], dim=-1)
        return q_nope, q_rope, cached

    def kv_b(self) -> tuple[Tensor, Tensor]:
        """W_UK [heads, nope, rank] and W_UV [heads, v, rank] of this rank's heads."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, kv_cache: KVCache,
                batch: ForwardBatch) -> Tensor:
        # x: [num_tokens, hidden]; rope: cos, sin [num_tokens, 1, rope // 2] or None
        n = x.shape[0]
        q_nope, q_rope, cached = self.project(x, rope)
        w_uk, w_uv = self.kv_b()
        # absorbed query: [heads, n, nope] @ [heads, nope, rank] -> [n, heads, rank]
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
        q = torch.cat([q_latent, q_rope], dim=-1)  # [n, heads, rank + rope]
        o_latent = self.backend.forward(q, cached, None, self.spec, kv_cache, batch)
        # [heads, n, rank] @ [heads, rank, v] -> [n, heads * v]
        o = torch.bmm(o_latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
        return self.o_proj(o.reshape(n, self.num_heads * self.v_dim), batch.lora)

    def expanded_attention(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        """The textbook form over one causal sequence x [n, hidden] (no cache): every head's
        keys and values expanded from the latent, softmax(q k^T * scale) v. For tests: the
        absorbed form must equal it. Returns the o_proj input [n, heads * v]."""
        n = x.shape[0]
        q_nope, q_rope, cached = self.project(x, rope)
        latent, k_rope = cached[:, 0, : self.rank], cached[:, :, self.rank :]
        kv = self.kv_b_proj(latent).view(n, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(n, self.num_heads, self.rope)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        scale = self.spec.softmax_scale(q.shape[-1])
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        out = torch.einsum("hqk,khd->qhd", probs, v.float()).to(x.dtype)
        return out.reshape(n, self.num_heads * self.v_dim)
