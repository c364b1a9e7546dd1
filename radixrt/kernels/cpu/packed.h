// Packed-weight products and dequantization, as templates the library's entry points share
// (packed_gemm.cpp exports them; decoder.cpp calls them inside its own parallel region).
// The layout and its PyTorch reference: radixrt/kernels/packed_reference.py.
//
// The product factors the group's scale and bias out of its sum:
//   sum_k x_k w_k = sum_g scale_g * (sum_{i in g} code_i x_i) + sum_g bias_g * (sum_{i in g} x_i)
// so a group of 32 costs, per row of x, one multiply and two fused multiply-adds on 16 lanes
// after its codes are widened to float once for every row of x. The rows of x (at most 8 at a
// time) share each decoded group.
//
// Dequantizing computes scale * code, rounded, then + bias: gguf's arithmetic, so GGUF weights
// come out bit for bit.
#pragma once
#include <omp.h>

#include "vec.h"

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef _Float16 h16 __attribute__((vector_size(32)));

enum : int { CODE_U4 = 0, CODE_I8 = 1 };
static const int64_t ROW_BLOCK = 16;  // rows of w a thread takes at a time
static const int64_t MAX_GEMM_ROWS = 16;  // rows of x one product takes (decode's batches)
static const int64_t MAX_XSUM = MAX_GEMM_ROWS * 512;  // their group sums: K up to 8192 / 16
static const int CHUNK = 64;          // blocks of 32 columns whose scales are read at a time
// codes are prefetched this far ahead of their use (rows follow each other in memory, so this
// reaches into the next tiles' rows): measured on the default model's shapes, 2 threads
// 5.2 -> 4.1 ms for 106M Q4_1 weights, the stream otherwise waits on memory
static const int PREFETCH_BYTES = 2048;

// 16 per-group values (scales or biases) from `offset` of a float16 or float32 array as float32,
// the first n of them (n <= 16; the rest 0).
template <bool F16>
static inline v16f group_values16(const void* base, int64_t offset, int n) {
#if defined(__AVX512F__)
  const __mmask16 m = (__mmask16)((1u << n) - 1);
  if (F16)
    return (v16f)_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)base + offset));
  return (v16f)_mm512_maskz_loadu_ps(m, (const float*)base + offset);
#else
  v16f out = (v16f){};
  for (int i = 0; i < n; ++i)
    out[i] = F16 ? (float)((const _Float16*)base)[offset + i] : ((const float*)base)[offset + i];
  return out;
#endif
}

// n per-group values from `offset` as float32 into out (n a multiple of 16 or the tail).
template <bool F16>
static inline void group_values(const void* base, int64_t offset, int n, float* out) {
  for (int i = 0; i < n; i += 16) {
    v16f v = group_values16<F16>(base, offset + i, n - i < 16 ? n - i : 16);
    memcpy(out + i, &v, sizeof v);
  }
}

// Codes 0-15 (h = 0) or 16-31 (h = 1) of a block of 32, widened to float (via int32: GCC
// vectorizes that; a direct u8 -> float conversion it does lane by lane).
template <int CODE>
static inline v16f codes_half(const uint8_t* codes, int h) {
  if (CODE == CODE_U4) {
    u8x16 b;
    memcpy(&b, codes, 16);
    u8x16 nib = h ? (u8x16)(b >> 4) : (u8x16)(b & 15);
    return __builtin_convertvector(__builtin_convertvector(nib, v16i), v16f);
  }
#if defined(__AVX512F__)  // GCC turns the portable form below into 16 scalar loads
  const __m128i b = _mm_loadu_si128((const __m128i*)(codes + 16 * h));
  return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
#else
  i8x16 b;
  memcpy(&b, codes + 16 * h, 16);
  return __builtin_convertvector(__builtin_convertvector(b, v16i), v16f);
#endif
}

struct Packed {
  const uint8_t* codes;
  const void* scales;
  const void* biases;
  int64_t K;           // columns
  int64_t groups;      // per row
  int64_t code_bytes;  // per row
};

static inline Packed packed(const uint8_t* codes, const void* scales, const void* biases, int code,
                            int group, int64_t K) {
  return Packed{codes, scales, biases, K, K / group, code == CODE_U4 ? K / 2 : K};
}

static inline const uint8_t* codes_at(const Packed& w, int CODE, int64_t n, int64_t k) {
  return w.codes + n * w.code_bytes + (CODE == CODE_U4 ? k / 2 : k);
}

// y[b, n0 + r] for b < BT, r < RT, accumulated in registers. xsum: [BT, ldxs] the sums of x
// over each group (the biases' factor), zero past the last group up to a multiple of 16.
template <int CODE, int GROUP, bool F16, int BT, int RT>
static inline void tile(const Packed& w, const float* x, const float* xsum, int64_t ldxs,
                        int64_t n0, float* y, int64_t ldy) {
  constexpr int PER32 = 32 / GROUP;  // groups per block of 32
  constexpr int NG = CHUNK * PER32;  // groups per chunk at most
  v16f acc[RT][BT], bacc[RT][BT];
  for (int r = 0; r < RT; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = bacc[r][b] = (v16f){};
  float sc[RT][NG + 16];
  for (int64_t c0 = 0; c0 < w.K; c0 += CHUNK * 32) {
    const int nblk = (int)((w.K - c0) / 32 < CHUNK ? (w.K - c0) / 32 : CHUNK);
    const int ng = nblk * PER32;
    const int64_t g0 = c0 / GROUP;
    for (int r = 0; r < RT; ++r) {
      group_values<F16>(w.scales, (n0 + r) * w.groups + g0, ng, sc[r]);
      for (int i = 0; i < ng; i += 16) {  // the bias term, 16 groups at a time
        const v16f bv = group_values16<F16>(w.biases, (n0 + r) * w.groups + g0 + i,
                                            ng - i < 16 ? ng - i : 16);
        for (int b = 0; b < BT; ++b)
          bacc[r][b] = fmadd(bv, load16(xsum + b * ldxs + g0 + i), bacc[r][b]);
      }
    }
    for (int j = 0; j < nblk; ++j) {
      const int64_t k = c0 + 32 * j;
      for (int r = 0; r < RT; ++r) {
        const uint8_t* cp = codes_at(w, CODE, n0 + r, k);
        __builtin_prefetch(cp + PREFETCH_BYTES);
        const v16f lo = codes_half<CODE>(cp, 0), hi = codes_half<CODE>(cp, 1);
        for (int b = 0; b < BT; ++b) {
          const float* xp = x + b * w.K + k;
          if (PER32 == 1) {
            v16f t = lo * load16(xp);
            t = fmadd(hi, load16(xp + 16), t);
            acc[r][b] = fmadd(sc[r][j] + (v16f){}, t, acc[r][b]);
          } else {
            acc[r][b] = fmadd(sc[r][2 * j] * lo, load16(xp), acc[r][b]);
            acc[r][b] = fmadd(sc[r][2 * j + 1] * hi, load16(xp + 16), acc[r][b]);
          }
        }
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int b = 0; b < BT; ++b) y[b * ldy + n0 + r] = hsum(acc[r][b]) + hsum(bacc[r][b]);
}

// Rows [lo, hi) of w against BT rows of x: tiles of RT rows (RT * BT accumulators).
template <int CODE, int GROUP, bool F16, int BT>
static void row_range(const Packed& w, const float* x, const float* xsum, int64_t ldxs,
                      int64_t lo, int64_t hi, float* y, int64_t ldy) {
  constexpr int RT = BT <= 2 ? 4 : BT <= 4 ? 2 : 1;
  int64_t n = lo;
  for (; n + RT <= hi; n += RT) tile<CODE, GROUP, F16, BT, RT>(w, x, xsum, ldxs, n, y, ldy);
  for (; n < hi; ++n) tile<CODE, GROUP, F16, BT, 1>(w, x, xsum, ldxs, n, y, ldy);
}

// y = x @ w.T for B rows of x, run by the calling team: every thread computes the group sums
// of x (a few hundred adds) itself, then the rows of w are shared out (an orphaned `omp for`:
// outside a parallel region the caller alone runs them). Ends with the loop's barrier.
template <int CODE, int GROUP, bool F16>
static void gemm_team(const Packed& w, const float* x, int64_t B, int64_t N, float* y) {
  const int64_t ldxs = (w.groups + 15) / 16 * 16;
  float xsum[MAX_XSUM];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < w.groups; ++g) {
      v16f s = load16(x + b * w.K + g * GROUP);
      if (GROUP == 32) s = s + load16(x + b * w.K + g * GROUP + 16);
      xsum[b * ldxs + g] = hsum(s);
    }
    for (int64_t g = w.groups; g < ldxs; ++g) xsum[b * ldxs + g] = 0.f;
  }
#pragma omp for schedule(static)
  for (int64_t n0 = 0; n0 < N; n0 += ROW_BLOCK) {
    const int64_t n1 = n0 + ROW_BLOCK < N ? n0 + ROW_BLOCK : N;
    for (int64_t b0 = 0; b0 < B;) {
      const int64_t left = B - b0;
      const float* xb = x + b0 * w.K;
      const float* sb = xsum + b0 * ldxs;
      float* yb = y + b0 * N;
      if (left >= 8) {
        row_range<CODE, GROUP, F16, 8>(w, xb, sb, ldxs, n0, n1, yb, N);
        b0 += 8;
      } else if (left >= 4) {
        row_range<CODE, GROUP, F16, 4>(w, xb, sb, ldxs, n0, n1, yb, N);
        b0 += 4;
      } else if (left >= 2) {
        row_range<CODE, GROUP, F16, 2>(w, xb, sb, ldxs, n0, n1, yb, N);
        b0 += 2;
      } else {
        row_range<CODE, GROUP, F16, 1>(w, xb, sb, ldxs, n0, n1, yb, N);
        b0 += 1;
      }
    }
  }
}

template <int CODE, int GROUP, bool F16>
static void dequant_row(const Packed& w, int64_t n, float* out) {
  constexpr int PER32 = 32 / GROUP;
  float sc[CHUNK * PER32 + 16], bi[CHUNK * PER32 + 16];
  for (int64_t c0 = 0; c0 < w.K; c0 += CHUNK * 32) {
    const int nblk = (int)((w.K - c0) / 32 < CHUNK ? (w.K - c0) / 32 : CHUNK);
    group_values<F16>(w.scales, n * w.groups + c0 / GROUP, nblk * PER32, sc);
    group_values<F16>(w.biases, n * w.groups + c0 / GROUP, nblk * PER32, bi);
    for (int j = 0; j < nblk; ++j) {
      const int64_t k = c0 + 32 * j;
      const uint8_t* cp = codes_at(w, CODE, n, k);
      const int s0 = j * PER32, s1 = s0 + PER32 - 1;
      v16f lo = codes_half<CODE>(cp, 0) * sc[s0];  // rounded, then the bias: gguf's order
      v16f hi = codes_half<CODE>(cp, 1) * sc[s1];
      lo = lo + bi[s0];
      hi = hi + bi[s1];
      memcpy(out + k, &lo, sizeof lo);
      memcpy(out + k + 16, &hi, sizeof hi);
    }
  }
}

template <int CODE, int GROUP, bool F16>
static void gather_team(const Packed& w, const int64_t* index, int64_t n, float* out) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) dequant_row<CODE, GROUP, F16>(w, index[i], out + i * w.K);
}

template <int CODE, int GROUP, bool F16>
static void rows_team(const Packed& w, int64_t row0, int64_t n, float* out) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) dequant_row<CODE, GROUP, F16>(w, row0 + i, out + i * w.K);
}


#define PACKED_DISPATCH(code, group, f16, FN, ...)                                         \
  do {                                                                                     \
    if (code == CODE_U4 && group == 32 && f16) FN<CODE_U4, 32, true>(__VA_ARGS__);          \
    else if (code == CODE_U4 && group == 32) FN<CODE_U4, 32, false>(__VA_ARGS__);           \
    else if (code == CODE_I8 && group == 32 && f16) FN<CODE_I8, 32, true>(__VA_ARGS__);     \
    else if (code == CODE_I8 && group == 32) FN<CODE_I8, 32, false>(__VA_ARGS__);           \
    else if (code == CODE_I8 && group == 16 && f16) FN<CODE_I8, 16, true>(__VA_ARGS__);     \
    else if (code == CODE_I8 && group == 16) FN<CODE_I8, 16, false>(__VA_ARGS__);          \
  } while (0)

static inline bool packed_supported(int code, int group) {
  return (code == CODE_U4 && group == 32) || (code == CODE_I8 && (group == 32 || group == 16));
}
