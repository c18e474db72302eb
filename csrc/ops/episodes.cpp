// CPU kernel of episode_update (see episodes.h).
#include "ops/episodes.h"

#include "ops/episodes_impl.h"

namespace nostall {

void episode_update_cpu(Tensor reward, Tensor done, Tensor running_return, Tensor running_length,
                        Tensor returns, Tensor lengths, Tensor finished) {
  check_episode_args(reward, done, running_return, running_length, returns, lengths, finished);
  const EpisodeLayout l = episode_layout(reward, done);
  episode_steps(
      reward.const_data_ptr<double>(), l.reward_row, l.reward_col, done.const_data_ptr<bool>(),
      l.done_row, l.done_col, l.T, l.N, running_return.mutable_data_ptr<double>(),
      running_length.mutable_data_ptr<int64_t>(), returns.mutable_data_ptr<double>(),
      lengths.mutable_data_ptr<int64_t>(), returns.size(0), finished.mutable_data_ptr<int64_t>());
}

}  // namespace nostall
