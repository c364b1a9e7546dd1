// The per-token layer work around the products, on float32 rows: RMSNorm (models/layers.py
// RMSNorm is its reference) and the gated MLP's activation times its up projection (SiLU as
// torch computes it, x / (1 + exp(-x)); GELU's tanh form as x * sigmoid(2 u)).
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
