// Group-relative advantages for GRPO (Shao et al. 2024, arXiv:2402.03300) and Dr. GRPO (Liu et al.
// 2025, arXiv:2503.20783), over groups of completions of any size.
//
//   mean_g       = mean of reward over group g
//   advantage_i  = (reward_i - mean_{g(i)}) / (std_i + eps)        scale "group" (GRPO)
//                  (reward_i - mean_{g(i)}) / (std of the batch + eps)  scale "batch"
//                  reward_i - mean_{g(i)}                               scale "none" (Dr. GRPO)
//
// std is the unbiased (Bessel-corrected) standard deviation, as torch.std and TRL use; a group of
// one has std 0 and advantage exactly 0 (never NaN). num_groups is an argument so no output shape
// depends on data. Sums are accumulated in float64.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/checks.h"
#include "common/dispatch.h"

namespace nostall {

enum class GroupScale { kGroup, kBatch, kNone };

inline GroupScale parse_group_scale(const std::string& scale) {
  if (scale == "group") return GroupScale::kGroup;
  if (scale == "batch") return GroupScale::kBatch;
  STD_TORCH_CHECK(scale == "none", "scale must be 'group', 'batch' or 'none', got '", scale, "'");
  return GroupScale::kNone;
}

inline void check_group_advantages_args(const Tensor& reward, const Tensor& group_index,
                                        int64_t num_groups, double eps) {
  STD_TORCH_CHECK(reward.dim() == 1, "reward must be a 1-D [N] tensor, got ", reward.dim(),
                  " dimensions");
  STD_TORCH_CHECK(is_floating(reward), "reward must be float32 or float64, got ",
                  torch::headeronly::toString(reward.scalar_type()));
  STD_TORCH_CHECK(reward.size(0) >= 1, "reward must hold at least one reward");
  STD_TORCH_CHECK(group_index.scalar_type() == ScalarType::Long, "group_index must be int64, got ",
                  torch::headeronly::toString(group_index.scalar_type()));
  STD_TORCH_CHECK(group_index.dim() == 1 && group_index.size(0) == reward.size(0),
                  "group_index must have the shape of reward [", reward.size(0), "]");
  STD_TORCH_CHECK(group_index.device() == reward.device(),
                  "group_index must be on the device of reward");
  STD_TORCH_CHECK(num_groups >= 1, "num_groups must be >= 1, got ", num_groups);
  // The statistics tables hold num_groups + 1 rows (the groups, then the batch) of at most 3
  // doubles: a num_groups whose table size int64 cannot hold would wrap to a wrong allocation.
  STD_TORCH_CHECK(num_groups < std::numeric_limits<int64_t>::max() / 3, "num_groups = ", num_groups,
                  " is too large: (num_groups + 1) * 3 statistics overflow int64");
  STD_TORCH_CHECK(eps >= 0.0 && std::isfinite(eps), "eps must be a finite number >= 0, got ", eps);
}

inline void check_group_advantages_backward_args(const Tensor& grad_advantage, const Tensor& reward,
                                                 const Tensor& group_index, int64_t num_groups,
                                                 double eps) {
  check_group_advantages_args(reward, group_index, num_groups, eps);
  STD_TORCH_CHECK(grad_advantage.dim() == 1 && grad_advantage.size(0) == reward.size(0),
                  "grad_advantage must have the shape of reward [", reward.size(0), "]");
  STD_TORCH_CHECK(grad_advantage.scalar_type() == reward.scalar_type(),
                  "grad_advantage must have the dtype of reward");
  STD_TORCH_CHECK(grad_advantage.device() == reward.device(),
                  "grad_advantage must be on the device of reward");
}

// Per-group statistics live in a float64 table of num_groups + 1 rows of [count, sum, sq] (sq:
// sum of squared deviations from the row's mean); the last row is the whole batch. The kernels
// fill it in two passes (count and sum, then sq) and every formula below reads it.
constexpr int kStatCols = 3;

struct Moments {
  double count, mean, std;
};

NOSTALL_HD inline Moments moments_of(const double* stats, int64_t row) {
  const double count = stats[row * kStatCols];
  const double mean = count > 0 ? stats[row * kStatCols + 1] / count : 0.0;
  // Unbiased; 0 for fewer than two members, so a group of one never divides by a NaN.
  const double std = count > 1 ? sqrt(stats[row * kStatCols + 2] / (count - 1)) : 0.0;
  return {count, mean, std};
}

// The row whose std scales group g's advantages (the group itself, or the batch).
NOSTALL_HD inline int64_t scale_row(GroupScale scale, int64_t g, int64_t num_groups) {
  return scale == GroupScale::kBatch ? num_groups : g;
}

// 1 / (std + eps), or 1 without scaling; 0 where std + eps is 0 (a constant group with eps = 0),
// whose advantages are 0 by definition.
NOSTALL_HD inline double inverse_divisor(GroupScale scale, const double* stats, int64_t g,
                                         int64_t num_groups, double eps) {
  if (scale == GroupScale::kNone) return 1.0;
  const double divisor = moments_of(stats, scale_row(scale, g, num_groups)).std + eps;
  return divisor > 0 ? 1.0 / divisor : 0.0;
}

// The adjoint needs two more sums per row, in a table of num_groups + 1 rows of [g1, g2]:
//   g1[g] = sum over group g of grad_i / divisor_i                 (through the mean)
//   g2[k] = sum over scale row k of grad_i * z_i / divisor_i ** 2  (through the std)
// with z_i = reward_i - mean_{g(i)}. Then, for reward j in group g and scale row k,
//   grad_reward_j = grad_j / divisor_j - g1[g] / count_g
//                   - (reward_j - mean_k) / ((count_k - 1) * std_k) * g2[k]
// (the last term only when scaling and std_k > 0: the std is not differentiable at 0).
constexpr int kAdjointCols = 2;

NOSTALL_HD inline double group_advantage_grad(GroupScale scale, const double* stats,
                                              const double* adjoint, double reward, double grad,
                                              int64_t g, int64_t num_groups, double eps) {
  const Moments group = moments_of(stats, g);
  const double inv = inverse_divisor(scale, stats, g, num_groups, eps);
  double out = grad * inv - adjoint[g * kAdjointCols] / group.count;
  if (scale != GroupScale::kNone && inv > 0) {
    const int64_t k = scale_row(scale, g, num_groups);
    const Moments row = moments_of(stats, k);
    if (row.std > 0) {
      out -= (reward - row.mean) / ((row.count - 1) * row.std) * adjoint[k * kAdjointCols + 1];
    }
  }
  return out;
}

Tensor group_advantages_cpu(Tensor reward, Tensor group_index, int64_t num_groups,
                            std::string scale, double eps);
Tensor group_advantages_backward_cpu(Tensor grad_advantage, Tensor reward, Tensor group_index,
                                     int64_t num_groups, std::string scale, double eps);
Tensor group_advantages_cuda(Tensor reward, Tensor group_index, int64_t num_groups,
                             std::string scale, double eps);
Tensor group_advantages_backward_cuda(Tensor grad_advantage, Tensor reward, Tensor group_index,
                                      int64_t num_groups, std::string scale, double eps);

}  // namespace nostall
