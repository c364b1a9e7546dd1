// The packed-weight products' entry points (the kernels: packed.h; the layout and its PyTorch
// reference: radixrt/kernels/packed_reference.py):
//
//   rx_packed_gemm:   y[b, n] = sum_k x[b, k] * w[n, k] for the few rows of x a decode step has.
//   rx_packed_rows:   rows [row0, row0 + n) of w as float32 (prefill's products run on them).
//   rx_packed_gather: rows index[0..n) of w as float32 (embedding lookups).
//
// Rows of w are split between the threads of the process's one OpenMP runtime (torch's: same
// soname, loaded first).
#include "packed.h"

extern "C" {

// Each returns 0, or -1 for a layout it has no kernel for (or more rows of x than it takes).
int rx_packed_gemm(const float* x, int64_t B, int64_t K, const uint8_t* codes, const void* scales,
                   const void* biases, int code, int group, int f16, int64_t N, float* y) {
  if (!packed_supported(code, group) || B > MAX_GEMM_ROWS || K / group > MAX_XSUM / MAX_GEMM_ROWS)
    return -1;
  const Packed w = packed(codes, scales, biases, code, group, K);
#pragma omp parallel
  PACKED_DISPATCH(code, group, f16, gemm_team, w, x, B, N, y);
  return 0;
}

int rx_packed_gather(const uint8_t* codes, const void* scales, const void* biases, int code,
                     int group, int f16, int64_t K, const int64_t* index, int64_t n, float* out) {
  if (!packed_supported(code, group)) return -1;
  const Packed w = packed(codes, scales, biases, code, group, K);
#pragma omp parallel if (n * K >= (1 << 16))
  PACKED_DISPATCH(code, group, f16, gather_team, w, index, n, out);
  return 0;
}

int rx_packed_rows(const uint8_t* codes, const void* scales, const void* biases, int code,
                   int group, int f16, int64_t K, int64_t row0, int64_t n, float* out) {
  if (!packed_supported(code, group)) return -1;
  const Packed w = packed(codes, scales, biases, code, group, K);
#pragma omp parallel if (n * K >= (1 << 16))
  PACKED_DISPATCH(code, group, f16, rows_team, w, row0, n, out);
  return 0;
}

}  // extern "C"
