// The per-token layer work around the products, on float32 rows: RMSNorm (models/layers.py
// RMSNorm is its reference), the gated MLP's activation times its up projection (SiLU as
// torch computes it, x / (1 + exp(-x)); GELU's tanh form as x * sigmoid(2 u)), and what the
// sampler asks of a row of logits: its first maximum and its log-sum-exp.
#pragma once
#include "vec.h"

enum : int { ACT_SILU = 0, ACT_GELU_TANH = 1 };

// out[t] = x[t] * r * (offset + w), r = 1 / sqrt(mean(x[t]^2) + eps); x * r rounded before the
// weight multiplies it, as the reference computes it (its sum of squares adds in another order).
static inline void rmsnorm_row(const float* x, const float* w, float* out, int64_t D, float eps,
                               float offset) {
  v16f ss = (v16f){};
  int64_t i = 0;
  for (; i + 16 <= D; i += 16) {
    const v16f v = load16(x + i);
    ss = fmadd(v, v, ss);
  }
  float sum = hsum(ss);
  for (; i < D; ++i) sum += x[i] * x[i];
  const float r = 1.f / sqrtf(sum / (float)D + eps);
  i = 0;
  for (; i + 16 <= D; i += 16) store16(out + i, (load16(x + i) * r) * (load16(w + i) + offset));
  for (; i < D; ++i) out[i] = (x[i] * r) * (w[i] + offset);
}

static inline v16f act16(int act, v16f g) {
  if (act == ACT_SILU) return g / (1.f + exp16(-g));
  // 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3), is g * sigmoid(2 u): no
  // cancellation near 0, where 1 + tanh's forms lose digits
  const v16f u = 0.7978845608f * (g + 0.044715f * g * g * g);
  return g / (1.f + exp16(-2.f * u));
}

// out [T, I] = act(gu[:, :I]) * gu[:, I:] for gate_up rows [T, 2 I] (token stride gu_stride).
static inline void act_mul_row(int act, const float* gu, int64_t I, float* out) {
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) store16(out + i, act16(act, load16(gu + i)) * load16(gu + I + i));
  for (; i < I; ++i) {
    v16f g = (v16f){};
    g[0] = gu[i];
    out[i] = act16(act, g)[0] * gu[I + i];
  }
}

// The index of the first maximum of x[0..n) and log(sum(exp(x))) over it (m + log of the
// shifted sum), in two passes over the row.
static inline void argmax_lse_row(const float* x, int64_t n, int64_t* index, float* lse) {
  float best = -INFINITY;
  int64_t at = 0;
  int64_t i = 0;
  v16f mv = splat(-INFINITY);
  for (; i + 16 <= n; i += 16) mv = mv > load16(x + i) ? mv : load16(x + i);
  best = hmax(mv);
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (i = 0; i < n; ++i)
    if (x[i] == best) {
      at = i;
      break;
    }
  v16f sv = (v16f){};
  i = 0;
  for (; i + 16 <= n; i += 16) sv = sv + exp16(load16(x + i) - best);
  float sum = hsum(sv);
  for (; i < n; ++i) sum += expf(x[i] - best);
  *index = at;
  *lse = best + logf(sum);
  if (best == -INFINITY || best == INFINITY) *lse = best;  // torch's: all -inf, or an inf
  if (sum != sum) {  // a NaN in the row: torch's argmax takes the first NaN as the maximum
    for (i = 0; i < n; ++i)
      if (x[i] != x[i]) {
        *index = i;
        *lse = NAN;
        break;
      }
  }
}
