// Entry points of the per-token layer work (layers.h): rx_rmsnorm, rx_act_mul, rx_argmax_lse.
#include "layers.h"

extern "C" {

void rx_rmsnorm(const float* x, int64_t x_stride, const float* w, float* out, int64_t T,
                int64_t D, float eps, float offset) {
  for (int64_t t = 0; t < T; ++t) rmsnorm_row(x + t * x_stride, w, out + t * D, D, eps, offset);
}

void rx_act_mul(int act, const float* gu, int64_t gu_stride, int64_t I, float* out, int64_t T) {
  for (int64_t t = 0; t < T; ++t) act_mul_row(act, gu + t * gu_stride, I, out + t * I);
}

void rx_argmax_lse(const float* x, int64_t rows, int64_t cols, int64_t* index, float* lse) {
  for (int64_t r = 0; r < rows; ++r) argmax_lse_row(x + r * cols, cols, index + r, lse + r);
}

}  // extern "C"
