// CPU kernels of mlp and its adjoint. A layer small enough that a BLAS call's fixed cost would
// dominate (a rollout step's batch) runs a direct loop over a transposed copy of the weight
// (the inner loop then runs along contiguous output units and vectorises); larger ones call
// BLAS through torch. Then one fused pass for the activation (float32 tanh vectorised, see
// cpu_rows.h) or its derivative.
#include "ops/mlp.h"

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "common/dispatch.h"
#include "ops/cpu_rows.h"
#include "ops/mlp_driver.h"

namespace nostall {

namespace {

constexpr int64_t kElementGrain = int64_t{1} << 14;
// Multiply-adds up to which a layer skips BLAS, whose fixed cost per call dominates there: a
// rollout step's 8 x 64 x 64 layer is 32k (benchmarks/ops/bench_policy.py times the whole op).
constexpr int64_t kDirectMacs = int64_t{1} << 15;

// out [M, J] (contiguous) = x [M, K] @ w [J, K]^T + b [J], any strides for x, w and b: the
// vectorised row kernel when the layout allows (float32, rows of x and w contiguous), else a
// loop over a transposed copy of w.
template <typename S>
void direct_linear(S* out, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t M = x.size(0), K = x.size(1), J = w.size(0);
  if constexpr (std::is_same_v<S, float>) {
    if (x.stride(1) == 1 && w.is_contiguous() && b.is_contiguous()) {
      rows::kernels().linear_f32(x.const_data_ptr<float>(), x.stride(0), M, K,
                                 w.const_data_ptr<float>(), b.const_data_ptr<float>(), J, out);
      return;
    }
  }
  thread_local std::vector<S> wt_buffer;  // w transposed: [K, J]
  wt_buffer.resize(static_cast<size_t>(K * J));
  S* wt = wt_buffer.data();
  const S* wp = w.const_data_ptr<S>();
  const int64_t ws0 = w.stride(0), ws1 = w.stride(1);
  for (int64_t j = 0; j < J; ++j) {
    for (int64_t k = 0; k < K; ++k) wt[k * J + j] = wp[j * ws0 + k * ws1];
  }
  const S* xp = x.const_data_ptr<S>();
  const S* bp = b.const_data_ptr<S>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), bs = b.stride(0);
  for (int64_t m = 0; m < M; ++m) {
    S* __restrict__ row = out + m * J;
    for (int64_t j = 0; j < J; ++j) row[j] = bp[j * bs];
    for (int64_t k = 0; k < K; ++k) {
      const S xk = xp[m * xs0 + k * xs1];
      const S* __restrict__ wk = wt + k * J;
      for (int64_t j = 0; j < J; ++j) row[j] += xk * wk[j];
    }
  }
}

struct CpuBackend {
  static void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) {
    if (x.size(0) * x.size(1) * w.size(0) <= kDirectMacs) {
      dispatch_floating(out.scalar_type(), [&](auto tag) {
        direct_linear(out.mutable_data_ptr<decltype(tag)>(), x, w, b);
      });
      return;
    }
    STD_TORCH_CHECK(aoti_torch_cpu_addmm_out(out.get(), b.get(), x.get(), transposed(w).get(), 1.0,
                                             1.0) == AOTI_TORCH_SUCCESS,
                    "mlp: matrix product failed");
  }

  static void column_sum(Tensor& out, const Tensor& g) {
    dispatch_floating(out.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      const int64_t M = g.size(0), J = g.size(1), s0 = g.stride(0), s1 = g.stride(1);
      const S* gp = g.const_data_ptr<S>();
      S* __restrict__ o = out.mutable_data_ptr<S>();
      for (int64_t j = 0; j < J; ++j) o[j] = S(0);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t j = 0; j < J; ++j) o[j] += gp[m * s0 + j * s1];
      }
    });
  }

  static void mm(Tensor& out, const Tensor& a, const Tensor& b) {
    STD_TORCH_CHECK(aoti_torch_cpu_mm_out(out.get(), a.get(), b.get()) == AOTI_TORCH_SUCCESS,
                    "mlp: matrix product failed");
  }

  static void activate(Tensor& h, Activation act) {
    dispatch_floating(h.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      S* x = h.mutable_data_ptr<S>();
      torch::stable::parallel_for(0, h.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {
        if (act == Activation::kRelu) {
          for (int64_t i = i0; i < i1; ++i) x[i] = x[i] < S(0) ? S(0) : x[i];  // NaN stays NaN
        } else if constexpr (std::is_same_v<S, float>) {
          rows::kernels().tanh_f32(x + i0, i1 - i0);
        } else {
          for (int64_t i = i0; i < i1; ++i) x[i] = std::tanh(x[i]);
        }
      });
    });
  }

  static void activation_grad(Tensor& g, const Tensor& h, Activation act) {
    dispatch_floating(g.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      S* gp = g.mutable_data_ptr<S>();
      const S* hp = h.const_data_ptr<S>();
      torch::stable::parallel_for(0, g.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {
        if (act == Activation::kRelu) {
          for (int64_t i = i0; i < i1; ++i) gp[i] = pick(hp[i] > S(0), gp[i], S(0));
        } else {
          for (int64_t i = i0; i < i1; ++i) gp[i] = gp[i] * (S(1) - hp[i] * hp[i]);
        }
      });
    });
  }
};

}  // namespace

MlpOutput mlp_cpu(Tensor input, std::vector<Tensor> weights, std::vector<Tensor> biases,
                  std::string activation) {
  return mlp_forward<CpuBackend>(input, weights, biases, activation);
}

MlpOutput mlp_cpu_checked(const Tensor& input, const std::vector<Tensor>& weights,
                          const std::vector<Tensor>& biases, Activation act) {
  return mlp_forward_checked<CpuBackend>(input, weights, biases, act);
}

MlpGrads mlp_backward_cpu(Tensor grad_output, Tensor input, std::vector<Tensor> weights,
                          std::vector<Tensor> hidden, std::string activation, bool input_grad) {
  return mlp_backward<CpuBackend>(grad_output, input, weights, hidden, activation, input_grad);
}

}  // namespace nostall
