// CUDA kernels for group_advantages and its adjoint: the per-group sums of the header's tables
// are float64 atomics (so their order, and the last bits, may vary from run to run), in passes
// ordered by the stream. A group index out of [0, num_groups) gives NaN for that completion and
// is left out of every sum: checking it would need a host sync (the CPU kernels raise).
#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "common/cuda_launch.cuh"
#include "common/tensor_utils.h"
#include "ops/group_advantages.h"

namespace nostall {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ inline bool in_range(int64_t g, int64_t num_groups) { return g >= 0 && g < num_groups; }

template <typename S>
__global__ void count_and_sum_kernel(const S* r, const int64_t* idx, double* stats, int64_t n,
                                     int64_t num_groups) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || !in_range(idx[i], num_groups)) return;
  atomicAdd(&stats[idx[i] * kStatCols], 1.0);
  atomicAdd(&stats[idx[i] * kStatCols + 1], static_cast<double>(r[i]));
  atomicAdd(&stats[num_groups * kStatCols], 1.0);
  atomicAdd(&stats[num_groups * kStatCols + 1], static_cast<double>(r[i]));
}

template <typename S>
__global__ void squares_kernel(const S* r, const int64_t* idx, double* stats, int64_t n,
                               int64_t num_groups) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || !in_range(idx[i], num_groups)) return;
  const double d = r[i] - moments_of(stats, idx[i]).mean;
  const double b = r[i] - moments_of(stats, num_groups).mean;
  atomicAdd(&stats[idx[i] * kStatCols + 2], d * d);
  atomicAdd(&stats[num_groups * kStatCols + 2], b * b);
}

template <typename S>
__global__ void advantage_kernel(const S* r, const int64_t* idx, const double* stats, S* adv,
                                 int64_t n, int64_t num_groups, GroupScale scale, double eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (!in_range(idx[i], num_groups)) {
    adv[i] = S(NAN);
    return;
  }
  const double z = r[i] - moments_of(stats, idx[i]).mean;
  adv[i] = static_cast<S>(z * inverse_divisor(scale, stats, idx[i], num_groups, eps));
}

template <typename S>
__global__ void adjoint_sums_kernel(const S* g, const S* r, const int64_t* idx, const double* stats,
                                    double* adjoint, int64_t n, int64_t num_groups,
                                    GroupScale scale, double eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || !in_range(idx[i], num_groups)) return;
  const double inv = inverse_divisor(scale, stats, idx[i], num_groups, eps);
  const double z = r[i] - moments_of(stats, idx[i]).mean;
  atomicAdd(&adjoint[idx[i] * kAdjointCols], g[i] * inv);
  atomicAdd(&adjoint[scale_row(scale, idx[i], num_groups) * kAdjointCols + 1],
            g[i] * z * inv * inv);
}

template <typename S>
__global__ void reward_grad_kernel(const S* g, const S* r, const int64_t* idx, const double* stats,
                                   const double* adjoint, S* out, int64_t n, int64_t num_groups,
                                   GroupScale scale, double eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = in_range(idx[i], num_groups)
               ? static_cast<S>(group_advantage_grad(scale, stats, adjoint, r[i], g[i], idx[i],
                                                     num_groups, eps))
               : S(NAN);
}

// The [num_groups + 1, kStatCols] float64 table, filled on the device.
template <typename S>
Tensor group_stats(const Tensor& reward, const Tensor& group_index, int64_t num_groups,
                   cudaStream_t stream) {
  Tensor stats = torch::stable::new_zeros(reward, {(num_groups + 1) * kStatCols},
                                          torch::headeronly::ScalarType::Double);
  const int64_t n = reward.size(0);
  double* s = stats.mutable_data_ptr<double>();
  count_and_sum_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
      reward.const_data_ptr<S>(), group_index.const_data_ptr<int64_t>(), s, n, num_groups);
  squares_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
      reward.const_data_ptr<S>(), group_index.const_data_ptr<int64_t>(), s, n, num_groups);
  check_launch("group statistics kernels");
  return stats;
}

}  // namespace

Tensor group_advantages_cuda(Tensor reward, Tensor group_index, int64_t num_groups,
                             std::string scale, double eps) {
  check_group_advantages_args(reward, group_index, num_groups, eps);
  const GroupScale mode = parse_group_scale(scale);
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  reward = as_contiguous(reward);
  group_index = as_contiguous(group_index);
  Tensor advantage = torch::stable::empty_like(reward);
  const int64_t n = reward.size(0);
  const cudaStream_t stream = current_stream(reward);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const Tensor stats = group_stats<S>(reward, group_index, num_groups, stream);
    advantage_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
        reward.const_data_ptr<S>(), group_index.const_data_ptr<int64_t>(),
        stats.const_data_ptr<double>(), out_ptr<S>(advantage), n, num_groups, mode, eps);
  });
  check_launch("advantage_kernel");
  return advantage;
}

Tensor group_advantages_backward_cuda(Tensor grad_advantage, Tensor reward, Tensor group_index,
                                      int64_t num_groups, std::string scale, double eps) {
  check_group_advantages_backward_args(grad_advantage, reward, group_index, num_groups, eps);
  const GroupScale mode = parse_group_scale(scale);
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  grad_advantage = as_contiguous(grad_advantage);
  reward = as_contiguous(reward);
  group_index = as_contiguous(group_index);
  Tensor grad_reward = torch::stable::empty_like(reward);
  const int64_t n = reward.size(0);
  const cudaStream_t stream = current_stream(reward);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const Tensor stats = group_stats<S>(reward, group_index, num_groups, stream);
    Tensor adjoint = torch::stable::new_zeros(reward, {(num_groups + 1) * kAdjointCols},
                                              torch::headeronly::ScalarType::Double);
    adjoint_sums_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
        grad_advantage.const_data_ptr<S>(), reward.const_data_ptr<S>(),
        group_index.const_data_ptr<int64_t>(), stats.const_data_ptr<double>(),
        adjoint.mutable_data_ptr<double>(), n, num_groups, mode, eps);
    reward_grad_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
        grad_advantage.const_data_ptr<S>(), reward.const_data_ptr<S>(),
        group_index.const_data_ptr<int64_t>(), stats.const_data_ptr<double>(),
        adjoint.const_data_ptr<double>(), out_ptr<S>(grad_reward), n, num_groups, mode, eps);
  });
  check_launch("group advantage adjoint kernels");
  return grad_reward;
}

}  // namespace nostall
