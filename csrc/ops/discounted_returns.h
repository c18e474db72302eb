// Discounted returns with the same episode-boundary rules as gae:
//
//   next[t]    = (done[t] or t == T - 1) ? bootstrap_value[t] : returns[t + 1]
//   returns[t] = reward[t] + (terminated[t] ? 0 : gamma * next[t])
//
// bootstrap_value[t] is the value of the state after step t; it is read only where the chain is
// cut without termination (a truncated episode, or the last step of the rollout).
#pragma once

#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/tensor_utils.h"

namespace nostall {

// Coefficient of returns[t + 1] in returns[t]: zero where the chain is cut or terminated.
template <typename S>
NOSTALL_HD inline S returns_discount(bool cut, bool terminated, S gamma) {
  return zero_if(cut || terminated, gamma);
}

template <typename S>
NOSTALL_HD inline S returns_step(S reward, S bootstrap, bool cut, bool terminated, S gamma,
                                 S next_return) {
  return reward + zero_if(terminated, gamma * pick(cut, bootstrap, next_return));
}

inline void check_discounted_returns_args(const Tensor& reward, const Tensor& done,
                                          const Tensor& terminated, const Tensor& bootstrap_value,
                                          double gamma) {
  check_time_major(reward, "reward");
  check_flags(done, "done", reward, "reward");
  check_flags(terminated, "terminated", reward, "reward");
  check_like(bootstrap_value, "bootstrap_value", reward, "reward");
  check_unit_interval(gamma, "gamma");
}

inline void check_discounted_returns_backward_args(const Tensor& grad_returns, const Tensor& done,
                                                   const Tensor& terminated, double gamma) {
  check_time_major(grad_returns, "grad_returns");
  check_flags(done, "done", grad_returns, "grad_returns");
  check_flags(terminated, "terminated", grad_returns, "grad_returns");
  check_unit_interval(gamma, "gamma");
}

Tensor discounted_returns_cpu(Tensor reward, Tensor done, Tensor terminated, Tensor bootstrap_value,
                              double gamma);
std::tuple<Tensor, Tensor> discounted_returns_backward_cpu(Tensor grad_returns, Tensor done,
                                                           Tensor terminated, double gamma);
Tensor discounted_returns_cuda(Tensor reward, Tensor done, Tensor terminated,
                               Tensor bootstrap_value, double gamma);
std::tuple<Tensor, Tensor> discounted_returns_backward_cuda(Tensor grad_returns, Tensor done,
                                                            Tensor terminated, double gamma);

}  // namespace nostall
