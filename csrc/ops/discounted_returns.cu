// CUDA kernels for discounted_returns and its adjoint: one thread per column.
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "ops/discounted_returns.h"

namespace nostall {

using torch::stable::empty_like;

template <typename S>
__global__ void discounted_returns_kernel(const S* __restrict__ r, const S* __restrict__ b,
                                          const bool* __restrict__ d, const bool* __restrict__ term,
                                          S* __restrict__ ret, int64_t T, int64_t N, S g) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  S following = S(0);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t i = t * N + n;
    following = returns_step(r[i], b[i], t == T - 1 || d[i], term[i], g, following);
    ret[i] = following;
  }
}

template <typename S>
__global__ void discounted_returns_backward_kernel(const S* __restrict__ gret,
                                                   const bool* __restrict__ d,
                                                   const bool* __restrict__ term,
                                                   S* __restrict__ gr, S* __restrict__ gb,
                                                   int64_t T, int64_t N, S g) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  S carry = S(0);  // discount(t - 1) * grad_reward[t - 1]
  for (int64_t t = 0; t < T; ++t) {
    const int64_t i = t * N + n;
    const S gx = gret[i] + carry;
    const bool cut = t == T - 1 || d[i];
    gr[i] = gx;
    gb[i] = (cut && !term[i]) ? g * gx : S(0);
    carry = returns_discount(d[i], term[i], g) * gx;
  }
}

Tensor discounted_returns_cuda(Tensor reward, Tensor done, Tensor terminated,
                               Tensor bootstrap_value, double gamma) {
  check_discounted_returns_args(reward, done, terminated, bootstrap_value, gamma);
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  reward = as_contiguous(reward);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  bootstrap_value = as_contiguous(bootstrap_value);
  Tensor returns = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  const cudaStream_t stream = current_stream(reward);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    discounted_returns_kernel<S><<<column_blocks(N), kColumnThreads, 0, stream>>>(
        in_ptr<S>(reward), in_ptr<S>(bootstrap_value), done.const_data_ptr<bool>(),
        terminated.const_data_ptr<bool>(), out_ptr<S>(returns), T, N, static_cast<S>(gamma));
  });
  check_launch("discounted_returns_kernel");
  return returns;
}

std::tuple<Tensor, Tensor> discounted_returns_backward_cuda(Tensor grad_returns, Tensor done,
                                                            Tensor terminated, double gamma) {
  check_discounted_returns_backward_args(grad_returns, done, terminated, gamma);
  torch::stable::accelerator::DeviceGuard guard(grad_returns.get_device_index());
  grad_returns = as_contiguous(grad_returns);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor grad_reward = empty_like(grad_returns);
  Tensor grad_bootstrap = empty_like(grad_returns);
  const int64_t T = grad_returns.size(0);
  const int64_t N = grad_returns.size(1);
  const cudaStream_t stream = current_stream(grad_returns);
  dispatch_floating(grad_returns.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    discounted_returns_backward_kernel<S><<<column_blocks(N), kColumnThreads, 0, stream>>>(
        in_ptr<S>(grad_returns), done.const_data_ptr<bool>(), terminated.const_data_ptr<bool>(),
        out_ptr<S>(grad_reward), out_ptr<S>(grad_bootstrap), T, N, static_cast<S>(gamma));
  });
  check_launch("discounted_returns_backward_kernel");
  return {grad_reward, grad_bootstrap};
}

}  // namespace nostall
