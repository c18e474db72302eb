// Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438), truncation-correct.
//
//   delta[t]     = reward[t] + (terminated[t] ? 0 : gamma * next_value[t]) - value[t]
//   advantage[t] = delta[t] + (done[t] ? 0 : gamma * lmbda * advantage[t + 1])
//   value_target = advantage + value
//
// `done` ends the recursion (termination or truncation); `terminated` alone drops the bootstrap,
// so a truncated step still bootstraps from next_value. All tensors are time-major [T, N].
#pragma once

#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/tensor_utils.h"

namespace nostall {

// One step of the backward-in-time recursion; `next_advantage` is advantage[t + 1] (0 past T).
template <typename S>
NOSTALL_HD inline S gae_step(S reward, S value, S next_value, bool done, bool terminated, S gamma,
                             S gamma_lmbda, S next_advantage) {
  const S delta = reward + zero_if(terminated, gamma * next_value) - value;
  return delta + zero_if(done, next_advantage * gamma_lmbda);
}

// The adjoint: grad_delta[t] = g[t] + (done[t - 1] ? 0 : gamma * lmbda * grad_delta[t - 1]).
template <typename S>
NOSTALL_HD inline S gae_adjoint_step(S g, bool prev_done, S gamma_lmbda, S prev_grad_delta) {
  return g + zero_if(prev_done, prev_grad_delta * gamma_lmbda);
}

inline void check_gae_args(const Tensor& reward, const Tensor& value, const Tensor& next_value,
                           const Tensor& done, const Tensor& terminated, double gamma,
                           double lmbda) {
  check_time_major(reward, "reward");
  check_like(value, "value", reward, "reward");
  check_like(next_value, "next_value", reward, "reward");
  check_flags(done, "done", reward, "reward");
  check_flags(terminated, "terminated", reward, "reward");
  check_unit_interval(gamma, "gamma");
  check_unit_interval(lmbda, "lmbda");
}

inline void check_gae_backward_args(const Tensor& grad_advantage, const Tensor& grad_value_target,
                                    const Tensor& done, const Tensor& terminated, double gamma,
                                    double lmbda) {
  check_time_major(grad_advantage, "grad_advantage");
  check_like(grad_value_target, "grad_value_target", grad_advantage, "grad_advantage");
  check_flags(done, "done", grad_advantage, "grad_advantage");
  check_flags(terminated, "terminated", grad_advantage, "grad_advantage");
  check_unit_interval(gamma, "gamma");
  check_unit_interval(lmbda, "lmbda");
}

std::tuple<Tensor, Tensor> gae_cpu(Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                   Tensor terminated, double gamma, double lmbda);
std::tuple<Tensor, Tensor, Tensor> gae_backward_cpu(Tensor grad_advantage, Tensor grad_value_target,
                                                    Tensor done, Tensor terminated, double gamma,
                                                    double lmbda);
std::tuple<Tensor, Tensor> gae_cuda(Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                    Tensor terminated, double gamma, double lmbda);
std::tuple<Tensor, Tensor, Tensor> gae_backward_cuda(Tensor grad_advantage,
                                                     Tensor grad_value_target, Tensor done,
                                                     Tensor terminated, double gamma, double lmbda);

}  // namespace nostall
