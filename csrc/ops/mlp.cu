// CUDA kernels of mlp and its adjoint: cuBLAS products through torch, then one elementwise
// kernel for the activation or its derivative, all on the current stream.
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "common/dispatch.h"
#include "ops/mlp.h"
#include "ops/mlp_driver.h"

namespace nostall {

namespace {

constexpr int kThreads = 256;

__device__ inline float tanh_of(float x) { return tanhf(x); }
__device__ inline double tanh_of(double x) { return tanh(x); }

template <typename S>
__global__ void activate_kernel(S* __restrict__ x, int64_t n, bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const S v = x[i];
    x[i] = relu ? (v < S(0) ? S(0) : v) : tanh_of(v);  // relu keeps NaN
  }
}

template <typename S>
__global__ void activation_grad_kernel(S* __restrict__ g, const S* __restrict__ h, int64_t n,
                                       bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const S y = h[i];
    g[i] = relu ? (y > S(0) ? g[i] : S(0)) : g[i] * (S(1) - y * y);
  }
}

unsigned element_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

struct CudaBackend {
  static void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) {
    STD_TORCH_CHECK(aoti_torch_cuda_addmm_out(out.get(), b.get(), x.get(), transposed(w).get(), 1.0,
                                              1.0) == AOTI_TORCH_SUCCESS,
                    "mlp: matrix product failed");
  }

  static void column_sum(Tensor& out, const Tensor& g) {
    const int64_t rows[1] = {0};
    torch::stable::sum_out(out, g, torch::headeronly::IntHeaderOnlyArrayRef(rows, 1));
  }

  static void mm(Tensor& out, const Tensor& a, const Tensor& b) {
    STD_TORCH_CHECK(aoti_torch_cuda_mm_out(out.get(), a.get(), b.get()) == AOTI_TORCH_SUCCESS,
                    "mlp: matrix product failed");
  }

  static void activate(Tensor& h, Activation act) {
    const int64_t n = h.numel();
    if (n == 0) return;
    dispatch_floating(h.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      activate_kernel<S><<<element_blocks(n), kThreads, 0, current_stream(h)>>>(
          h.mutable_data_ptr<S>(), n, act == Activation::kRelu);
    });
    check_launch("mlp activation");
  }

  static void activation_grad(Tensor& g, const Tensor& h, Activation act) {
    const int64_t n = g.numel();
    if (n == 0) return;
    dispatch_floating(g.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      activation_grad_kernel<S><<<element_blocks(n), kThreads, 0, current_stream(g)>>>(
          g.mutable_data_ptr<S>(), h.const_data_ptr<S>(), n, act == Activation::kRelu);
    });
    check_launch("mlp activation gradient");
  }
};

}  // namespace

MlpOutput mlp_cuda(Tensor input, std::vector<Tensor> weights, std::vector<Tensor> biases,
                   std::string activation) {
  // Kernels and GEMMs launch on the current device: make it the inputs' one.
  torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  return mlp_forward<CudaBackend>(input, weights, biases, activation);
}

MlpGrads mlp_backward_cuda(Tensor grad_output, Tensor input, std::vector<Tensor> weights,
                           std::vector<Tensor> hidden, std::string activation, bool input_grad) {
  // Kernels and GEMMs launch on the current device: make it the inputs' one.
  torch::stable::accelerator::DeviceGuard guard(grad_output.get_device_index());
  return mlp_backward<CudaBackend>(grad_output, input, weights, hidden, activation, input_grad);
}

}  // namespace nostall
