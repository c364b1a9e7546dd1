// A small step's decoder layers in one call (radixrt/runtime/models/fused_decode.py builds the
// arguments; its reference is the model's own layers, models/decoder.py, which run the same
// kernels one by one: the two give the same floats, bit for bit).
//
// Per layer, for B token rows (a decode step's one new token per request, or a few new tokens of
// a request: speculative drafts, a short prompt chunk):
//   x = rmsnorm(h)                       input_layernorm
//   qkv = x @ Wqkv.T (+ bias)            packed product
//   q, k per-head rmsnorm (Qwen3, Gemma 3), rotary on q and k, k and v into their slots
//   a = attention(q, KV)                 decode_team over (request, KV head)
//   h = h + (a @ Wo.T (+ bias)) * rs     o_proj, residual (rs: Granite's residual scale)
//   x = rmsnorm(h)                       post_attention_layernorm
//   g = act(x @ Wg.T) * (x @ Wu.T)       gate_up (+ bias), SiLU or GELU-tanh
//   h = h + (g @ Wd.T (+ bias)) * rs     down_proj, residual
// and, on a step with LoRA adapters, each product plus its rows' adapters' (lora_add)
// all inside one OpenMP parallel region: row loops and products are work-shared (`omp for`),
// each ending at its barrier, so a layer costs a handful of barriers instead of a dozen
// parallel regions and Python calls.
#include "attention.h"
#include "layers.h"
#include "packed.h"

struct PackedArg {
  const uint8_t* codes;
  const void* scales;
  const void* biases;
  int32_t code, group, f16, unused;
  int64_t rows, cols;
};

// A projection's LoRA adapter slots (runtime/models/lora_layer.py's LoraSlots; a null: none):
// the slots' A stacked [slots * rank, cols] and B in its layout [rows, slots * rank].
struct LoraArg {
  const float* a;
  const float* b;
  int64_t rank, slots;
};

struct LayerArg {
  PackedArg qkv, o, gate_up, down;
  const float* qkv_bias;  // each null when the layer has none
  const float* o_bias;
  const float* gate_up_bias;
  const float* down_bias;
  const float* in_norm;
  const float* post_norm;
  const float* q_norm;  // [D], per head
  const float* k_norm;
  float* k_cache;  // this layer's [S, Hkv, D]
  float* v_cache;
  const float* sinks;  // [H] or null
  int64_t window;      // 0: full attention
  float scale, logit_cap, residual_scale;
  int32_t act;   // ACT_SILU, ACT_GELU_TANH
  int32_t rope;  // -1: none, else which of the step's cos / sin tables
  LoraArg qkv_lora, o_lora, gate_up_lora, down_lora;
};

struct StepArg {
  int64_t B, hidden, H, Hkv, D, inter, rotary_dim;
  float eps, norm_offset;
  float* h;             // [B, hidden], the residual stream, updated in place
  const float* cos[2];  // [B, rotary_dim / 2] per rope table (global, local)
  const float* sin[2];
  const int64_t* out_slots;   // [B]: here B counts tokens (query rows), R requests
  const int64_t* qo_indptr;   // [R + 1] each request's rows
  const int64_t* kv_indptr;   // [R + 1]
  const int64_t* kv_indices;  // the requests' whole slot lists
  int64_t requests;
  float* scratch;             // B * (qkv rows + H * D + 2 * inter + inter + hidden) floats
  const int64_t* lora_slot;   // [B] each row's LoRA slot (-1: none); null: no adapter this step
  float* lora_t;              // B * the largest LoRA slot rank floats
};

static inline Packed unpack(const PackedArg& p) {
  return packed(p.codes, p.scales, p.biases, p.code, p.group, p.cols);
}

static void product(const PackedArg& p, const float* x, int64_t B, float* y) {
  const Packed w = unpack(p);
  PACKED_DISPATCH(p.code, p.group, p.f16, gemm_team, w, x, B, p.rows, y);
}

// y [B, N] += each row's adapter's (x_b A_s^T) B_s^T, s its slot: the row's own slot only (the
// PyTorch path, lora_layer.py, takes the same sum over every slot, the others' terms zero)
static void lora_add(const LoraArg& L, const StepArg& s, const float* x, int64_t K, float* y,
                     int64_t N) {
  if (!L.a || !s.lora_slot) return;
  const int64_t B = s.B, R = L.rank, ld = L.slots * R;
#pragma omp for schedule(static)
  for (int64_t i = 0; i < B * R; ++i) {
    const int64_t b = i / R, slot = s.lora_slot[b];
    s.lora_t[i] = slot < 0 ? 0.f : dot(x + b * K, L.a + (slot * R + i % R) * K, (int)K);
  }
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t slot = s.lora_slot[b];
      if (slot < 0) continue;
      const float* row = L.b + n * ld + slot * R;
      const float* t = s.lora_t + b * R;
      float acc = 0.f;
      for (int64_t r = 0; r < R; ++r) acc += t[r] * row[r];
      y[b * N + n] += acc;
    }
}

static inline void add_bias(float* y, const float* bias, int64_t n) {
  if (bias)
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + bias[i];
}

static inline void residual(float* h, const float* y, int64_t n, float rs) {
  if (rs != 1.f)
    for (int64_t i = 0; i < n; ++i) h[i] = h[i] + y[i] * rs;
  else
    for (int64_t i = 0; i < n; ++i) h[i] = h[i] + y[i];
}

static void layer(const LayerArg& L, const StepArg& s, float* x, float* qkv, float* attn,
                  float* gu, float* act, float* y) {
  const int64_t B = s.B, Dm = s.hidden, D = s.D, H = s.H, Hkv = s.Hkv;
  const int64_t nqkv = L.qkv.rows, qd = H * D, kvd = Hkv * D;
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) rmsnorm_row(s.h + b * Dm, L.in_norm, x + b * Dm, Dm, s.eps,
                                              s.norm_offset);
  product(L.qkv, x, B, qkv);
  lora_add(L.qkv_lora, s, x, Dm, qkv, nqkv);
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    float* row = qkv + b * nqkv;
    add_bias(row, L.qkv_bias, nqkv);
    if (L.q_norm) {
      for (int64_t h = 0; h < H; ++h)
        rmsnorm_row(row + h * D, L.q_norm, row + h * D, D, s.eps, s.norm_offset);
      for (int64_t h = 0; h < Hkv; ++h)
        rmsnorm_row(row + qd + h * D, L.k_norm, row + qd + h * D, D, s.eps, s.norm_offset);
    }
    if (L.rope >= 0) {
      const int64_t half = s.rotary_dim / 2;
      rotate(row, nqkv, H, D, s.cos[L.rope] + b * half, s.sin[L.rope] + b * half, 1,
             s.rotary_dim);
      rotate(row + qd, nqkv, Hkv, D, s.cos[L.rope] + b * half, s.sin[L.rope] + b * half, 1,
             s.rotary_dim);
    }
    store_kv(L.k_cache, L.v_cache, row + qd, row + qd + kvd, nqkv, nqkv, s.out_slots + b, 1,
             kvd);
  }
  // q rows gathered contiguous for the attention kernel ([B, H, D])
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) memcpy(attn + b * qd, qkv + b * nqkv, sizeof(float) * qd);
  float* out = qkv;  // q's rows are no longer needed: the attention output goes there
  const DecodeArgs a{attn, out, L.k_cache, L.v_cache, s.qo_indptr, s.kv_indptr, s.kv_indices,
                     s.requests, H, Hkv, D, L.scale, L.logit_cap, L.window, L.sinks, nullptr, B};
  decode_team(a);
  product(L.o, out, B, y);
  lora_add(L.o_lora, s, out, qd, y, Dm);
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    add_bias(y + b * Dm, L.o_bias, Dm);
    residual(s.h + b * Dm, y + b * Dm, Dm, L.residual_scale);
    rmsnorm_row(s.h + b * Dm, L.post_norm, x + b * Dm, Dm, s.eps, s.norm_offset);
  }
  product(L.gate_up, x, B, gu);
  lora_add(L.gate_up_lora, s, x, Dm, gu, 2 * s.inter);
  const int64_t I = s.inter;
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    add_bias(gu + b * 2 * I, L.gate_up_bias, 2 * I);
    act_mul_row(L.act, gu + b * 2 * I, I, act + b * I);
  }
  product(L.down, act, B, y);
  lora_add(L.down_lora, s, act, s.inter, y, Dm);
#pragma omp for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    add_bias(y + b * Dm, L.down_bias, Dm);
    residual(s.h + b * Dm, y + b * Dm, Dm, L.residual_scale);
  }
}

extern "C" {

// 0, or -1 for shapes outside the kernels' (the caller runs the layers one by one instead).
int rx_decode_layers(const LayerArg* layers, int64_t n_layers, const StepArg* s) {
  if (s->B > MAX_GEMM_ROWS || !decode_supported(s->H, s->Hkv, s->D)) return -1;
  for (int64_t i = 0; i < n_layers; ++i) {
    const PackedArg* ps[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up, &layers[i].down};
    for (const PackedArg* p : ps)
      if (!packed_supported(p->code, p->group) || p->cols / p->group > MAX_XSUM / MAX_GEMM_ROWS)
        return -1;
  }
  const int64_t B = s->B, nqkv = layers[0].qkv.rows;
  float* x = s->scratch;
  float* qkv = x + B * s->hidden;
  float* attn = qkv + B * nqkv;
  float* gu = attn + B * s->H * s->D;
  float* act = gu + B * 2 * s->inter;
  float* y = act + B * s->inter;
#pragma omp parallel
  for (int64_t i = 0; i < n_layers; ++i) layer(layers[i], *s, x, qkv, attn, gu, act, y);
  return 0;
}

}  // extern "C"
