// CPU kernel of clipped_adam_step (see clipped_adam.h).
#include "ops/clipped_adam.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/decoder_core.h"

namespace nostall {

namespace {

// Partial sums of a sum of squares: 32 of them, four vectors' worth, so the adds of one do not
// wait on the last (one vector of eight left the loop at the latency of its add: a 135M-shape
// gradient's norm ran at a third of the memory's speed).
constexpr int64_t kLanes = 32;

// The sum of squares in kLanes partial sums (they vectorize), added in double at the end.
NOSTALL_AVX2_CLONES double sum_of_squares(const float* __restrict g, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += g[i + j] * g[i + j];
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(g[i]) * g[i];
  for (float a : acc) total += a;
  return total;
}

// The update, element by element (it vectorizes: the build has no errno for sqrt).
NOSTALL_AVX2_CLONES void adam_pass(float* __restrict p, float* __restrict g, float* __restrict m,
                                   float* __restrict v, int64_t n, float clip, float beta1,
                                   float beta2, float step_size, float bias2_sqrt, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * clip;
    g[i] = gi;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (std::sqrt(vi) / bias2_sqrt + eps);
  }
}

// sum_of_squares of a bf16 gradient, each value widened (exactly) in the loop.
NOSTALL_AVX2_CLONES double sum_of_squares_bf16(const uint16_t* __restrict g, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const float x = decoder::widen_bf16(g[i + j]);
      acc[j] += x * x;
    }
  }
  double total = 0.0;
  for (; i < n; ++i)
    total += static_cast<double>(decoder::widen_bf16(g[i])) * decoder::widen_bf16(g[i]);
  for (float a : acc) total += a;
  return total;
}

// adam_pass from a bf16 gradient (left as it is), the new parameters also rounded into `rounded`.
NOSTALL_AVX2_CLONES void adam_pass_bf16(float* __restrict p, const uint16_t* __restrict g,
                                        float* __restrict m, float* __restrict v,
                                        uint16_t* __restrict rounded, int64_t n, float clip,
                                        float beta1, float beta2, float step_size, float bias2_sqrt,
                                        float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = decoder::widen_bf16(g[i]) * clip;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] - step_size * mi / (std::sqrt(vi) / bias2_sqrt + eps);
    p[i] = pi;
    rounded[i] = decoder::narrow_bf16(pi);
  }
}

// The checks both steps share; returns n.
int64_t check_step(const char* op, const Tensor& param, const Tensor& exp_avg,
                   const Tensor& exp_avg_sq, const Tensor& step, double lr, double beta1,
                   double beta2, double eps, double max_grad_norm) {
  STD_TORCH_CHECK(param.scalar_type() == ScalarType::Float && param.dim() == 1 &&
                      param.is_contiguous() && param.is_cpu(),
                  op, ": param must be a contiguous CPU float32 [n]");
  const int64_t n = param.size(0);
  const auto check_like = [&](const Tensor& t, const char* name) {
    STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float && t.dim() == 1 && t.size(0) == n &&
                        t.is_contiguous() && t.is_cpu(),
                    op, ": ", name, " must be a contiguous CPU float32 [", n, "], as param");
  };
  check_like(exp_avg, "exp_avg");
  check_like(exp_avg_sq, "exp_avg_sq");
  STD_TORCH_CHECK(step.scalar_type() == ScalarType::Float && step.dim() == 0 && step.is_cpu(), op,
                  ": step must be a CPU float32 scalar tensor");
  STD_TORCH_CHECK(lr >= 0.0, op, ": lr must be non-negative, got ", lr);
  STD_TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, op, ": beta1 must be in [0, 1), got ", beta1);
  STD_TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, op, ": beta2 must be in [0, 1), got ", beta2);
  STD_TORCH_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
  STD_TORCH_CHECK(max_grad_norm > 0.0, op, ": max_grad_norm must be positive, got ", max_grad_norm);
  return n;
}

// As clip_grad_norm_: the coefficient in float32 (a NaN or infinite norm spreads, as there).
float clip_coefficient(double sum_of_squares, double max_grad_norm) {
  const float norm = static_cast<float>(std::sqrt(sum_of_squares));
  const float coef = static_cast<float>(max_grad_norm) / (norm + 1e-6f);
  return std::isnan(coef) ? coef : std::min(coef, 1.0f);
}

}  // namespace

void clipped_adam_step_bf16_cpu(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                                Tensor step, Tensor rounded, double lr, double beta1, double beta2,
                                double eps, double max_grad_norm) {
  const char* op = "clipped_adam_step_bf16";
  const int64_t n =
      check_step(op, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm);
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&grad, "grad"},
                                std::pair<const Tensor*, const char*>{&rounded, "rounded"}}) {
    STD_TORCH_CHECK(t->scalar_type() == ScalarType::BFloat16 && t->dim() == 1 && t->size(0) == n &&
                        t->is_contiguous() && t->is_cpu(),
                    op, ": ", name, " must be a contiguous CPU bfloat16 [", n, "], as param");
  }
  const auto* g = static_cast<const uint16_t*>(grad.const_data_ptr());
  // A master copy is the size of a real model (tens of millions of parameters and up): both
  // passes run on torch's threads, in fixed blocks, the norm's partial sums added in block
  // order (the same result whatever the thread count).
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  torch::stable::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      partial[b] = sum_of_squares_bf16(g + b * kBlock, std::min(kBlock, n - b * kBlock));
    }
  });
  double total = 0.0;
  for (double part : partial) total += part;
  const float clip = clip_coefficient(total, max_grad_norm);
  float* count = step.mutable_data_ptr<float>();
  *count += 1.0f;
  const double t = *count;
  const double bias1 = 1.0 - std::pow(beta1, t), bias2 = 1.0 - std::pow(beta2, t);
  float* p = param.mutable_data_ptr<float>();
  float* m = exp_avg.mutable_data_ptr<float>();
  float* v = exp_avg_sq.mutable_data_ptr<float>();
  auto* out = static_cast<uint16_t*>(rounded.mutable_data_ptr());
  torch::stable::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t start = b0 * kBlock, count = std::min(b1 * kBlock, n) - start;
    adam_pass_bf16(p + start, g + start, m + start, v + start, out + start, count, clip,
                   static_cast<float>(beta1), static_cast<float>(beta2),
                   static_cast<float>(lr / bias1), static_cast<float>(std::sqrt(bias2)),
                   static_cast<float>(eps));
  });
}

void clipped_adam_step_cpu(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                           Tensor step, double lr, double beta1, double beta2, double eps,
                           double max_grad_norm) {
  const char* op = "clipped_adam_step";
  const int64_t n =
      check_step(op, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, max_grad_norm);
  STD_TORCH_CHECK(grad.scalar_type() == ScalarType::Float && grad.dim() == 1 && grad.size(0) == n &&
                      grad.is_contiguous() && grad.is_cpu(),
                  op, ": grad must be a contiguous CPU float32 [", n, "], as param");
  float* g = grad.mutable_data_ptr<float>();
  const float clip = clip_coefficient(sum_of_squares(g, n), max_grad_norm);
  float* count = step.mutable_data_ptr<float>();
  *count += 1.0f;
  const double t = *count;
  const double bias1 = 1.0 - std::pow(beta1, t), bias2 = 1.0 - std::pow(beta2, t);
  adam_pass(param.mutable_data_ptr<float>(), g, exp_avg.mutable_data_ptr<float>(),
            exp_avg_sq.mutable_data_ptr<float>(), n, clip, static_cast<float>(beta1),
            static_cast<float>(beta2), static_cast<float>(lr / bias1),
            static_cast<float>(std::sqrt(bias2)), static_cast<float>(eps));
}

}  // namespace nostall
