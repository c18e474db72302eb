// CUDA kernels for gae and its adjoint: one thread per column, rows walked in time order.
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "ops/gae.h"

namespace nostall {

using torch::stable::empty_like;

template <typename S>
__global__ void gae_kernel(const S* __restrict__ r, const S* __restrict__ v,
                           const S* __restrict__ nv, const bool* __restrict__ d,
                           const bool* __restrict__ term, S* __restrict__ adv, S* __restrict__ vt,
                           int64_t T, int64_t N, S g, S gl) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  S carry = S(0);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t i = t * N + n;
    carry = gae_step(r[i], v[i], nv[i], d[i], term[i], g, gl, carry);
    adv[i] = carry;
    vt[i] = carry + v[i];
  }
}

template <typename S>
__global__ void gae_backward_kernel(const S* __restrict__ ga, const S* __restrict__ gvt,
                                    const bool* __restrict__ d, const bool* __restrict__ term,
                                    S* __restrict__ gr, S* __restrict__ gv, S* __restrict__ gnv,
                                    int64_t T, int64_t N, S g, S gl) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  S carry = S(0);
  bool prev_done = true;  // nothing precedes t = 0
  for (int64_t t = 0; t < T; ++t) {
    const int64_t i = t * N + n;
    carry = gae_adjoint_step(ga[i] + gvt[i], prev_done, gl, carry);
    gr[i] = carry;
    gv[i] = gvt[i] - carry;
    gnv[i] = term[i] ? S(0) : g * carry;
    prev_done = d[i];
  }
}

std::tuple<Tensor, Tensor> gae_cuda(Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                    Tensor terminated, double gamma, double lmbda) {
  check_gae_args(reward, value, next_value, done, terminated, gamma, lmbda);
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  reward = as_contiguous(reward);
  value = as_contiguous(value);
  next_value = as_contiguous(next_value);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor advantage = empty_like(reward);
  Tensor value_target = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  const cudaStream_t stream = current_stream(reward);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    gae_kernel<S><<<column_blocks(N), kColumnThreads, 0, stream>>>(
        in_ptr<S>(reward), in_ptr<S>(value), in_ptr<S>(next_value), done.const_data_ptr<bool>(),
        terminated.const_data_ptr<bool>(), out_ptr<S>(advantage), out_ptr<S>(value_target), T, N,
        static_cast<S>(gamma), static_cast<S>(gamma * lmbda));
  });
  check_launch("gae_kernel");
  return {advantage, value_target};
}

std::tuple<Tensor, Tensor, Tensor> gae_backward_cuda(Tensor grad_advantage,
                                                     Tensor grad_value_target, Tensor done,
                                                     Tensor terminated, double gamma,
                                                     double lmbda) {
  check_gae_backward_args(grad_advantage, grad_value_target, done, terminated, gamma, lmbda);
  torch::stable::accelerator::DeviceGuard guard(grad_advantage.get_device_index());
  grad_advantage = as_contiguous(grad_advantage);
  grad_value_target = as_contiguous(grad_value_target);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor grad_reward = empty_like(grad_advantage);
  Tensor grad_value = empty_like(grad_advantage);
  Tensor grad_next_value = empty_like(grad_advantage);
  const int64_t T = grad_advantage.size(0);
  const int64_t N = grad_advantage.size(1);
  const cudaStream_t stream = current_stream(grad_advantage);
  dispatch_floating(grad_advantage.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    gae_backward_kernel<S><<<column_blocks(N), kColumnThreads, 0, stream>>>(
        in_ptr<S>(grad_advantage), in_ptr<S>(grad_value_target), done.const_data_ptr<bool>(),
        terminated.const_data_ptr<bool>(), out_ptr<S>(grad_reward), out_ptr<S>(grad_value),
        out_ptr<S>(grad_next_value), T, N, static_cast<S>(gamma), static_cast<S>(gamma * lmbda));
  });
  check_launch("gae_backward_kernel");
  return {grad_reward, grad_value, grad_next_value};
}

}  // namespace nostall
