// The decode step's attention entry points (the kernels: attention.h):
//
//   rx_decode_attention  query rows against their request's KV, read in place through its slot
//                        list: one decode token per request (decode_attention_ref; plus the
//                        log-sum-exp), or a few new tokens each, causally (extend_attention_ref)
//   rx_store_kv          the new tokens' K and V into their slots (store_kv_ref)
//   rx_rotate_qk         rotary embedding of q and k in place (models/rope.py apply_rotary)
#include "attention.h"

static const int64_t PARALLEL_MIN_WORK = 1 << 15;  // key x head x dim products per call

extern "C" {

// 0, or -1 when the shapes are outside what the kernel handles (head_dim a multiple of 16 up to
// 256, at most MAX_GROUP query heads per KV head): the caller takes the PyTorch path.
// qo_indptr: each request's query rows ([B + 1]; T = qo_indptr[B]), or null for one each.
int rx_decode_attention(const float* q, float* o, const float* k_cache, const float* v_cache,
                        const int64_t* qo_indptr, const int64_t* kv_indptr,
                        const int64_t* kv_indices, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float sm_scale, int64_t window, float logit_cap, const float* sinks,
                        float* lse) {
  if (!decode_supported(H, Hkv, D)) return -1;
  const int64_t T = qo_indptr ? qo_indptr[B] : B;
  const DecodeArgs a{q, o, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, B, H, Hkv, D,
                     sm_scale, logit_cap, window, sinks, lse, T};
  const int64_t work = (kv_indptr[B] - kv_indptr[0]) * H * D;
#pragma omp parallel if (work >= PARALLEL_MIN_WORK)
  decode_team(a);
  return 0;
}

void rx_store_kv(float* k_cache, float* v_cache, const float* k, const float* v, int64_t k_stride,
                 int64_t v_stride, const int64_t* out_slots, int64_t T, int64_t row) {
  store_kv(k_cache, v_cache, k, v, k_stride, v_stride, out_slots, T, row);
}

void rx_rotate_qk(float* q, int64_t q_stride, int64_t H, float* k, int64_t k_stride, int64_t Hkv,
                  int64_t D, const float* cos, const float* sin, int64_t T, int64_t R) {
  rotate(q, q_stride, H, D, cos, sin, T, R);
  rotate(k, k_stride, Hkv, D, cos, sin, T, R);
}

}  // extern "C"
