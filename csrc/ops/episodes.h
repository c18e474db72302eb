// Episode statistics of a vectorised rollout, one step at a time, with no host sync: each
// env's running return and length grow by its step; envs whose episode ended (in env order)
// write their return and length into the next cells of a ring of the most recent episodes,
// then restart from zero. Logging reads the ring now and then; the step itself never does.
//
//   running_return += reward; running_length += 1
//   for each done env e, r its rank among this step's done envs:
//     returns[(finished + r) % C] = running_return[e]; lengths[...] = running_length[e]
//     running_return[e] = 0; running_length[e] = 0
//   finished += number of done envs
// reward and done are one step [N], or T steps [T, N] (time-major), taken in order.
#pragma once

#include "common/checks.h"

namespace nostall {

inline void check_episode_args(const Tensor& reward, const Tensor& done,
                               const Tensor& running_return, const Tensor& running_length,
                               const Tensor& returns, const Tensor& lengths,
                               const Tensor& finished) {
  STD_TORCH_CHECK(
      (reward.dim() == 1 || reward.dim() == 2) && reward.scalar_type() == ScalarType::Double,
      "reward must be a float64 [N] or [T, N] tensor");
  const int64_t N = reward.size(reward.dim() - 1);
  STD_TORCH_CHECK(done.dim() == reward.dim() && done.size(0) == reward.size(0) &&
                      done.size(done.dim() - 1) == N && done.scalar_type() == ScalarType::Bool,
                  "done must be a bool tensor of reward's shape");
  STD_TORCH_CHECK(running_return.dim() == 1 && running_return.size(0) == N &&
                      running_return.scalar_type() == ScalarType::Double,
                  "running_return must be a float64 [", N, "] tensor, matching reward");
  STD_TORCH_CHECK(running_length.dim() == 1 && running_length.size(0) == N &&
                      running_length.scalar_type() == ScalarType::Long,
                  "running_length must be an int64 [", N, "] tensor, matching reward");
  STD_TORCH_CHECK(
      returns.dim() == 1 && returns.size(0) >= 1 && returns.scalar_type() == ScalarType::Double,
      "returns must be a float64 [C] tensor with C >= 1");
  STD_TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == returns.size(0) &&
                      lengths.scalar_type() == ScalarType::Long,
                  "lengths must be an int64 [", returns.size(0), "] tensor, matching returns");
  STD_TORCH_CHECK(finished.dim() == 0 && finished.scalar_type() == ScalarType::Long,
                  "finished must be an int64 scalar tensor");
  for (const Tensor* t : {&done, &running_return, &running_length, &returns, &lengths, &finished}) {
    STD_TORCH_CHECK(t->device() == reward.device(),
                    "episode_update: every tensor must be on the device of reward");
  }
  for (const Tensor* t : {&running_return, &running_length, &returns, &lengths}) {
    STD_TORCH_CHECK(t->is_contiguous(), "episode_update: the statistics must be contiguous");
  }
}

// The steps in reward's leading dimension (1 for a [N] reward) and the strides walking them.
struct EpisodeLayout {
  int64_t T, N, reward_row, reward_col, done_row, done_col;
};

inline EpisodeLayout episode_layout(const Tensor& reward, const Tensor& done) {
  if (reward.dim() == 1) return {1, reward.size(0), 0, reward.stride(0), 0, done.stride(0)};
  return {reward.size(0),   reward.size(1), reward.stride(0),
          reward.stride(1), done.stride(0), done.stride(1)};
}

void episode_update_cpu(Tensor reward, Tensor done, Tensor running_return, Tensor running_length,
                        Tensor returns, Tensor lengths, Tensor finished);
void episode_update_cuda(Tensor reward, Tensor done, Tensor running_return, Tensor running_length,
                         Tensor returns, Tensor lengths, Tensor finished);

}  // namespace nostall
