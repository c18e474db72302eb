// CUDA kernel for vtrace: one thread per column, rows walked backward in time.
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "ops/vtrace.h"

namespace nostall {

using torch::stable::empty_like;

template <typename S>
__global__ void vtrace_kernel(const S* __restrict__ blp, const S* __restrict__ tlp,
                              const S* __restrict__ r, const S* __restrict__ v,
                              const S* __restrict__ nv, const bool* __restrict__ d,
                              const bool* __restrict__ term, S* __restrict__ vs, S* __restrict__ pg,
                              int64_t T, int64_t N, S g, S rb, S cb) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  S acc = S(0);
  S following_vs = S(0);  // value_target[t + 1]
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t i = t * N + n;
    const S ratio = exp(tlp[i] - blp[i]);
    const S rho = clipped(ratio, rb);
    const S c = clipped(ratio, cb);
    const bool cut = t == T - 1 || d[i];
    acc = rho * bootstrapped_td(r[i], v[i], nv[i], term[i], g) + (cut ? S(0) : g * c * acc);
    const S vs_t = acc + v[i];
    pg[i] = rho * bootstrapped_td(r[i], v[i], cut ? nv[i] : following_vs, term[i], g);
    vs[i] = vs_t;
    following_vs = vs_t;
  }
}

std::tuple<Tensor, Tensor> vtrace_cuda(Tensor behavior_log_prob, Tensor target_log_prob,
                                       Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                       Tensor terminated, double gamma, double rho_bar,
                                       double c_bar) {
  check_vtrace_args(behavior_log_prob, target_log_prob, reward, value, next_value, done, terminated,
                    gamma, rho_bar, c_bar);
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  behavior_log_prob = as_contiguous(behavior_log_prob);
  target_log_prob = as_contiguous(target_log_prob);
  reward = as_contiguous(reward);
  value = as_contiguous(value);
  next_value = as_contiguous(next_value);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor value_target = empty_like(reward);
  Tensor pg_advantage = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  const cudaStream_t stream = current_stream(reward);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    vtrace_kernel<S><<<column_blocks(N), kColumnThreads, 0, stream>>>(
        in_ptr<S>(behavior_log_prob), in_ptr<S>(target_log_prob), in_ptr<S>(reward),
        in_ptr<S>(value), in_ptr<S>(next_value), done.const_data_ptr<bool>(),
        terminated.const_data_ptr<bool>(), out_ptr<S>(value_target), out_ptr<S>(pg_advantage), T, N,
        static_cast<S>(gamma), static_cast<S>(rho_bar), static_cast<S>(c_bar));
  });
  check_launch("vtrace_kernel");
  return {value_target, pg_advantage};
}

}  // namespace nostall
