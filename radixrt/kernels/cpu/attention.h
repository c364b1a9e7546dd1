// Attention work of a decode step on the CPU, on the paged KV pool as the PyTorch references
// lay it out (radixrt/kernels/reference.py: k_cache / v_cache [num_slots + 1, kv_heads,
// head_dim], a request's KV in the slots kv_indices[kv_indptr[i]:kv_indptr[i + 1]]).
//
// attention: one task per (query row, KV head): the KV head's query heads (GQA) read each key and
// value once; a query row sees its request's KV up to its own position (decode rows: all of
// it; a short extend's rows: causally); an online softmax over blocks of 16 keys (scores, their max, exp16, the running
// sum and the output rescaled). Scores are dot products in float32, scaled, soft-capped if
// logit_cap > 0; a sink logit (gpt-oss) joins the denominator at the end.
// rotate: rotary embedding in place, rotate-half over the first rotary_dim dimensions, each
// product rounded as the PyTorch reference (models/rope.py apply_rotary) computes it.
#pragma once
#include <omp.h>

#include "vec.h"

static const int KEY_BLOCK = 16;
static const int MAX_GROUP = 64;  // query heads per KV head the stack buffers hold

static inline float dot(const float* a, const float* b, int d) {
  v16f acc = (v16f){};
  for (int i = 0; i < d; i += 16) acc = fmadd(load16(a + i), load16(b + i), acc);
  return hsum(acc);
}

struct DecodeArgs {
  const float* q;        // [T, H, D]: one row per query token
  float* o;              // [T, H, D]
  const float* k_cache;  // [S, Hkv, D]
  const float* v_cache;
  const int64_t* qo_indptr;  // [B + 1] each request's query rows; null: one row each (T = B)
  const int64_t* indptr;     // [B + 1] each request's KV (prefix + its new tokens)
  const int64_t* indices;
  int64_t B, H, Hkv, D;
  float scale, logit_cap;
  int64_t window;        // 0: none; else the last `window` keys a query sees
  const float* sinks;    // [H] or null
  float* lse;            // [T, H] or null
  int64_t T;             // query rows
};

static inline bool decode_supported(int64_t H, int64_t Hkv, int64_t D) {
  return D % 16 == 0 && D <= 256 && Hkv > 0 && H % Hkv == 0 && H / Hkv <= MAX_GROUP;
}

// The request query row t belongs to (qo_indptr ascending; B is small).
static inline int64_t request_of(const DecodeArgs& a, int64_t t) {
  if (!a.qo_indptr) return t;
  int64_t lo = 0, hi = a.B - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.qo_indptr[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Query row t (of request b) against the keys it sees: its request's KV up to its own position
// (the causal rule of kernels/reference.py: new token j after a prefix P sees positions 0..P+j),
// the last `window` of them under a sliding window; its KV head kvh's query heads together.
static void decode_one(const DecodeArgs& a, int64_t t, int64_t b, int64_t kvh, int g0 = 0,
                       int gn = -1) {
  // query heads g0 .. g0 + gn of the KV head's group (all of them by default)
  const int D = (int)a.D;
  const int G = gn < 0 ? (int)(a.H / a.Hkv) : gn;
  const int64_t h0 = kvh * (a.H / a.Hkv) + g0;  // the first query head
  int64_t first = a.indptr[b], last = a.indptr[b + 1];
  if (a.qo_indptr) {  // the request's later query rows are not visible to this one
    last -= a.qo_indptr[b + 1] - 1 - t;
  }
  if (a.window > 0 && last - first > a.window) first = last - a.window;
  const float* qs = a.q + (t * a.H + h0) * D;
  float acc[MAX_GROUP][256];
  float m[MAX_GROUP], l[MAX_GROUP];
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
    memset(acc[g], 0, sizeof(float) * D);
  }
  const int64_t row = a.Hkv * D;  // floats per slot
  for (int64_t j0 = first; j0 < last; j0 += KEY_BLOCK) {
    const int n = (int)(last - j0 < KEY_BLOCK ? last - j0 : KEY_BLOCK);
    const float* ks[KEY_BLOCK];
    const float* vs[KEY_BLOCK];
    for (int j = 0; j < n; ++j) {
      const int64_t slot = a.indices[j0 + j];
      ks[j] = a.k_cache + slot * row + kvh * D;
      vs[j] = a.v_cache + slot * row + kvh * D;
    }
    for (int g = 0; g < G; ++g) {
      v16f s = splat(-INFINITY);
      for (int j = 0; j < n; ++j) {
        float x = dot(qs + g * D, ks[j], D) * a.scale;
        if (a.logit_cap > 0.f) x = a.logit_cap * tanhf(x / a.logit_cap);
        s[j] = x;
      }
      const float m_new = fmaxf(m[g], hmax(s));
      const float alpha = m[g] == -INFINITY ? 0.f : expf(m[g] - m_new);
      const v16f p = exp16(s - m_new);
      l[g] = l[g] * alpha + hsum(p);
      m[g] = m_new;
      float* out = acc[g];
      for (int d = 0; d < D; d += 16) {
        v16f o = load16(out + d) * alpha;
        for (int j = 0; j < n; ++j) o = fmadd(splat(p[j]), load16(vs[j] + d), o);
        store16(out + d, o);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t h = h0 + g;
    float denom = l[g];
    if (a.sinks) denom += expf(a.sinks[h] - m[g]);
    const float inv = 1.f / denom;
    float* o = a.o + (t * a.H + h) * D;
    for (int d = 0; d < D; d += 16) store16(o + d, load16(acc[g] + d) * inv);
    if (a.lse) a.lse[t * a.H + h] = m[g] + logf(l[g]);
  }
}

// Every (query row, KV head) task of the call, shared out among the calling team (an orphaned
// `omp for`); ends with the loop's barrier. Too few tasks for the team (a batch of one or two
// decode rows) split each KV head's query heads into tasks of their own: each rereads the
// head's keys (cache-resident) but every thread gets work.
static void decode_team(const DecodeArgs& a) {
  const int G = (int)(a.H / a.Hkv);
  const int64_t pairs = a.T * a.Hkv;
  const int per = pairs >= 4 * omp_get_num_threads() ? G : 1;  // query heads per task
  const int chunks = (G + per - 1) / per;
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < pairs * chunks; ++t) {
    const int64_t pair = t / chunks, row = pair / a.Hkv;
    const int g0 = (int)(t % chunks) * per;
    decode_one(a, row, request_of(a, row), pair % a.Hkv, g0, G - g0 < per ? G - g0 : per);
  }
}

// k_cache / v_cache rows out_slots[t] <- k[t], v[t] ([T, Hkv, D], token stride in floats).
static inline void store_kv(float* k_cache, float* v_cache, const float* k, const float* v,
                            int64_t k_stride, int64_t v_stride, const int64_t* out_slots,
                            int64_t T, int64_t row) {
  for (int64_t t = 0; t < T; ++t) {
    memcpy(k_cache + out_slots[t] * row, k + t * k_stride, sizeof(float) * row);
    memcpy(v_cache + out_slots[t] * row, v + t * v_stride, sizeof(float) * row);
  }
}

// x [T, heads, D] (token stride x_stride, heads contiguous) rotated in place: for i < R / 2,
// (x[i], x[i + R/2]) <- (x[i] c - x[i + R/2] s, x[i + R/2] c + x[i] s), c, s = cos[t, i],
// sin[t, i] ([T, R / 2]); each product rounded, as the PyTorch reference computes it.
static inline void rotate(float* x, int64_t x_stride, int64_t heads, int64_t D, const float* cos,
                   const float* sin, int64_t T, int64_t R) {
  const int64_t half = R / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + t * x_stride + h * D;
      int64_t i = 0;
      for (; i + 16 <= half; i += 16) {
        const v16f x1 = load16(p + i), x2 = load16(p + i + half);
        const v16f cv = load16(c + i), sv = load16(s + i);
        store16(p + i, x1 * cv - x2 * sv);
        store16(p + i + half, x2 * cv + x1 * sv);
      }
      for (; i < half; ++i) {
        const float x1 = p[i], x2 = p[i + half];
        p[i] = x1 * c[i] - x2 * s[i];
        p[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

