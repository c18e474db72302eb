// CUDA kernel of episode_update: one thread walks the N envs in order (the ring's order is the
// env order, and N is a rollout's env count), on the current stream: no host sync.
#include "common/cuda_launch.cuh"
#include "ops/episodes.h"
#include "ops/episodes_impl.h"

namespace nostall {

namespace {

__global__ void episode_kernel(const double* reward, EpisodeLayout l, const bool* done,
                               double* running_return, int64_t* running_length, double* returns,
                               int64_t* lengths, int64_t capacity, int64_t* finished) {
  episode_steps(reward, l.reward_row, l.reward_col, done, l.done_row, l.done_col, l.T, l.N,
                running_return, running_length, returns, lengths, capacity, finished);
}

}  // namespace

void episode_update_cuda(Tensor reward, Tensor done, Tensor running_return, Tensor running_length,
                         Tensor returns, Tensor lengths, Tensor finished) {
  // Kernels and GEMMs launch on the current device: make it the inputs' one.
  torch::stable::accelerator::DeviceGuard guard(reward.get_device_index());
  check_episode_args(reward, done, running_return, running_length, returns, lengths, finished);
  episode_kernel<<<1, 1, 0, current_stream(reward)>>>(
      reward.const_data_ptr<double>(), episode_layout(reward, done), done.const_data_ptr<bool>(),
      running_return.mutable_data_ptr<double>(), running_length.mutable_data_ptr<int64_t>(),
      returns.mutable_data_ptr<double>(), lengths.mutable_data_ptr<int64_t>(), returns.size(0),
      finished.mutable_data_ptr<int64_t>());
  check_launch("episode_update");
}

}  // namespace nostall
