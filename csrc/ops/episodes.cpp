// CPU kernel of episode_update (see episodes.h).
#include "ops/episodes.h"

#include "ops/episodes_impl.h"

namespace nostall {

void episode_update_cpu(Tensor reward, Tensor done, Tensor running_return, Tensor running_length,
                        Tensor returns, Tensor lengths, Tensor finished) {
  check_episode_args(reward, done, running_return, running_length, returns, lengths, finished);
  episode_step(reward.const_data_ptr<double>(), reward.stride(0), done.const_data_ptr<bool>(),
               done.stride(0), reward.size(0), running_return.mutable_data_ptr<double>(),
               running_length.mutable_data_ptr<int64_t>(), returns.mutable_data_ptr<double>(),
               lengths.mutable_data_ptr<int64_t>(), returns.size(0),
               finished.mutable_data_ptr<int64_t>());
}

}  // namespace nostall
