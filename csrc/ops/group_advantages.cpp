// CPU kernels for group_advantages and its adjoint. Rollout batches hold at most a few thousand
// completions, so each pass is one serial loop over them; sums are float64.
#include "ops/group_advantages.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

#include "common/tensor_utils.h"

namespace nostall {

using torch::stable::empty_like;

namespace {

// The [num_groups + 1, kStatCols] table of counts, sums and squared deviations (see the header),
// checking every group index: a bad one names its position.
template <typename S>
std::vector<double> group_stats(const S* r, const int64_t* idx, int64_t n, int64_t num_groups) {
  std::vector<double> stats((num_groups + 1) * kStatCols, 0.0);
  double* batch = stats.data() + num_groups * kStatCols;
  for (int64_t i = 0; i < n; ++i) {
    STD_TORCH_CHECK(idx[i] >= 0 && idx[i] < num_groups, "group_index[", i, "] = ", idx[i],
                    " is outside [0, num_groups = ", num_groups, ")");
    double* row = stats.data() + idx[i] * kStatCols;
    row[0] += 1;
    row[1] += r[i];
    batch[0] += 1;
    batch[1] += r[i];
  }
  const double batch_mean = moments_of(stats.data(), num_groups).mean;
  for (int64_t i = 0; i < n; ++i) {
    const double d = r[i] - moments_of(stats.data(), idx[i]).mean;
    stats[idx[i] * kStatCols + 2] += d * d;
    batch[2] += (r[i] - batch_mean) * (r[i] - batch_mean);
  }
  return stats;
}

}  // namespace

Tensor group_advantages_cpu(Tensor reward, Tensor group_index, int64_t num_groups,
                            std::string scale, double eps) {
  check_group_advantages_args(reward, group_index, num_groups, eps);
  const GroupScale mode = parse_group_scale(scale);
  reward = as_contiguous(reward);
  group_index = as_contiguous(group_index);
  Tensor advantage = empty_like(reward);
  const int64_t n = reward.size(0);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* r = in_ptr<S>(reward);
    const int64_t* idx = group_index.const_data_ptr<int64_t>();
    S* adv = out_ptr<S>(advantage);
    const std::vector<double> stats = group_stats(r, idx, n, num_groups);
    for (int64_t i = 0; i < n; ++i) {
      const double z = r[i] - moments_of(stats.data(), idx[i]).mean;
      adv[i] = static_cast<S>(z * inverse_divisor(mode, stats.data(), idx[i], num_groups, eps));
    }
  });
  return advantage;
}

Tensor group_advantages_backward_cpu(Tensor grad_advantage, Tensor reward, Tensor group_index,
                                     int64_t num_groups, std::string scale, double eps) {
  check_group_advantages_backward_args(grad_advantage, reward, group_index, num_groups, eps);
  const GroupScale mode = parse_group_scale(scale);
  grad_advantage = as_contiguous(grad_advantage);
  reward = as_contiguous(reward);
  group_index = as_contiguous(group_index);
  Tensor grad_reward = empty_like(reward);
  const int64_t n = reward.size(0);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* r = in_ptr<S>(reward);
    const S* g = in_ptr<S>(grad_advantage);
    const int64_t* idx = group_index.const_data_ptr<int64_t>();
    S* out = out_ptr<S>(grad_reward);
    const std::vector<double> stats = group_stats(r, idx, n, num_groups);
    std::vector<double> adjoint((num_groups + 1) * kAdjointCols, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double inv = inverse_divisor(mode, stats.data(), idx[i], num_groups, eps);
      const double z = r[i] - moments_of(stats.data(), idx[i]).mean;
      adjoint[idx[i] * kAdjointCols] += g[i] * inv;
      adjoint[scale_row(mode, idx[i], num_groups) * kAdjointCols + 1] += g[i] * z * inv * inv;
    }
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<S>(group_advantage_grad(mode, stats.data(), adjoint.data(), r[i], g[i],
                                                   idx[i], num_groups, eps));
    }
  });
  return grad_reward;
}

}  // namespace nostall
