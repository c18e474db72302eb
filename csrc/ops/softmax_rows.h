// Row kernels of token_log_prob on the CPU, for float32 and bfloat16 rows (bfloat16 passed as
// its uint16 bits): logsumexp of a row, and the softmax part of its gradient. Each has a
// baseline build and, on x86-64, an AVX2 build picked at run time (softmax_rows_avx2.cpp).
#pragma once

#include <cstdint>

namespace nostall::rows {

struct Kernels {
  float (*logsumexp_f32)(const float* x, int64_t V);
  float (*logsumexp_bf16)(const uint16_t* x, int64_t V);
  // out[v] = -g * exp(x[v] - lse); out may alias x.
  void (*softmax_grad_f32)(const float* x, float* out, int64_t V, float g, float lse);
  void (*softmax_grad_bf16)(const uint16_t* x, uint16_t* out, int64_t V, float g, float lse);
};

// The best kernels this CPU runs (chosen once).
const Kernels& kernels();

Kernels baseline_kernels();
// Null function pointers where the build or the CPU has no AVX2.
Kernels avx2_kernels();

}  // namespace nostall::rows
