// The episode-statistics steps of episodes.h over raw pointers, shared by the CPU kernel and the
// single-thread CUDA kernel (T steps in time order, each over the N envs in order: the ring's
// order is the order in which episodes ended, ties in env order).
#pragma once

#include <cstdint>

#include "common/dispatch.h"

namespace nostall {

NOSTALL_HD inline void episode_step(const double* reward, int64_t reward_stride, const bool* done,
                                    int64_t done_stride, int64_t N, double* running_return,
                                    int64_t* running_length, double* returns, int64_t* lengths,
                                    int64_t capacity, int64_t* finished) {
  int64_t count = *finished;
  for (int64_t e = 0; e < N; ++e) {
    running_return[e] += reward[e * reward_stride];
    running_length[e] += 1;
    if (done[e * done_stride]) {
      const int64_t slot = count % capacity;
      returns[slot] = running_return[e];
      lengths[slot] = running_length[e];
      running_return[e] = 0.0;
      running_length[e] = 0;
      ++count;
    }
  }
  *finished = count;
}

// T steps, step t's rewards and flags rows reward_row_stride and done_row_stride further on.
NOSTALL_HD inline void episode_steps(const double* reward, int64_t reward_row_stride,
                                     int64_t reward_stride, const bool* done,
                                     int64_t done_row_stride, int64_t done_stride, int64_t T,
                                     int64_t N, double* running_return, int64_t* running_length,
                                     double* returns, int64_t* lengths, int64_t capacity,
                                     int64_t* finished) {
  for (int64_t t = 0; t < T; ++t) {
    episode_step(reward + t * reward_row_stride, reward_stride, done + t * done_row_stride,
                 done_stride, N, running_return, running_length, returns, lengths, capacity,
                 finished);
  }
}

}  // namespace nostall
