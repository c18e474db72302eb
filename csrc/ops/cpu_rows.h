// Vectorised CPU row kernels, for float32 and bfloat16 rows (bfloat16 passed as its uint16
// bits): logsumexp of a row and the softmax part of its gradient (token_log_prob), the entropy
// of a row's softmax and its gradient (token_entropy_linear), the
// clipped policy loss of one sequence, tanh and small linear layers (mlp). Each has a
// baseline build and, on x86-64, an AVX2 build picked at run time (cpu_rows_avx2.cpp).
#pragma once

#include <cstdint>

namespace nostall::rows {

// One sequence of the clipped policy loss (see policy_loss.h for the formulas), float32.
struct PolicyRow {
  const float* log_prob;
  const float* old_log_prob;
  const float* behavior_log_prob;  // null: no importance weight
  const float* advantage;          // per token; null: `advantage_value` for the whole row
  float advantage_value;
  const uint8_t* mask;  // bool bytes
  int64_t T;
  float lo, hi;     // the clip range of the ratio
  float dual_clip;  // <= 0: off
  float is_cap;
};

struct Kernels {
  float (*logsumexp_f32)(const float* x, int64_t V);
  float (*logsumexp_bf16)(const uint16_t* x, int64_t V);
  // out[v] = -g * exp(x[v] - lse); out may alias x.
  void (*softmax_grad_f32)(const float* x, float* out, int64_t V, float g, float lse);
  void (*softmax_grad_bf16)(const uint16_t* x, uint16_t* out, int64_t V, float g, float lse);
  // The row's sums {loss, tokens, clipped tokens, kl} over unmasked tokens, into sums[4]; with
  // grad non-null, also grad[t] = grad_scale * d loss / d log_prob[t] (0 where masked).
  void (*policy_row_f32)(const PolicyRow& row, float* sums, float* grad, float grad_scale);
  // x[i] = tanh(x[i]) for n floats, within a few ulp of tanhf.
  void (*tanh_f32)(float* x, int64_t n);
  // out [M, J] (contiguous) = x [M, K] @ w [J, K]^T + b [J]; x's rows x_stride apart, each
  // contiguous; w and b contiguous.
  void (*linear_f32)(const float* x, int64_t x_stride, int64_t M, int64_t K, const float* w,
                     const float* b, int64_t J, float* out);
  // The entropy -sum_v p[v] log p[v] of p = softmax(x), given lse = logsumexp(x).
  float (*entropy_f32)(const float* x, int64_t V, float lse);
  float (*entropy_bf16)(const uint16_t* x, int64_t V, float lse);
  // out[v] = -g * p[v] * (log p[v] + entropy), the gradient of g * entropy; out may alias x.
  void (*entropy_grad_f32)(const float* x, float* out, int64_t V, float g, float lse,
                           float entropy);
  void (*entropy_grad_bf16)(const uint16_t* x, uint16_t* out, int64_t V, float g, float lse,
                            float entropy);
};

// The best kernels this CPU runs (chosen once).
const Kernels& kernels();

Kernels baseline_kernels();
// Null function pointers where the build or the CPU has no AVX2.
Kernels avx2_kernels();

}  // namespace nostall::rows
