// Shared vector helpers of the CPU kernels: 16 float lanes as GCC vector extensions (AVX-512
// where the machine has it, AVX2 halves or SSE otherwise), fused multiply-add, horizontal sums,
// and exp. The library is built with -ffp-contract=off: a * b + c is two roundings unless
// fmadd() says otherwise.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f fmadd(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
  return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  return a * b + c;  // two roundings without AVX-512: the sum's order differs anyway
#endif
}

static inline v16f load16(const float* p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void store16(float* p, v16f v) { memcpy(p, &v, sizeof v); }

static inline v16f splat(float x) { return x + (v16f){}; }

static inline float hsum(v16f v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

static inline float hmax(v16f v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps((__m512)v);
#else
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m;
  return m;
#endif
}

// exp(x) on 16 lanes, within 2 ulp of expf over [-87, 88]; 0 below about -103.9 (and for
// -inf), +inf above 88.7: x = k ln2 + r (ln2 in two parts), exp(r) by a degree-6 polynomial
// on |r| <= ln2 / 2, times 2^k put into the exponent bits.
static inline v16f exp16(v16f x) {
  const v16f hi = splat(88.7228f), lo = splat(-103.9721f);
  x = x > hi ? hi : x;
  v16i under = x < lo;
  x = x < lo ? lo : x;
  v16f kf = __builtin_convertvector(__builtin_convertvector(x * 1.44269504089f +
                                                            (x < 0 ? -0.5f : 0.5f), v16i), v16f);
  v16f r = x - kf * 0.693359375f;
  r = r + kf * 2.12194440e-4f;
  v16f p = splat(1.9875691500e-4f);
  p = fmadd(p, r, splat(1.3981999507e-3f));
  p = fmadd(p, r, splat(8.3334519073e-3f));
  p = fmadd(p, r, splat(4.1665795894e-2f));
  p = fmadd(p, r, splat(1.6666665459e-1f));
  p = fmadd(p, r, splat(5.0000001201e-1f));
  p = fmadd(p * r, r, r + 1.0f);
  // 2^k in two factors, so k down to -150 stays normal-or-subnormal without overflow
  v16i k = __builtin_convertvector(kf, v16i);
  v16i k1 = k >> 1, k2 = k - k1;
  v16f s1, s2;
  v16i b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  v16f out = p * s1 * s2;
  return under ? splat(0.f) : out;
}
