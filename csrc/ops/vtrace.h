// V-trace off-policy targets (Espeholt et al. 2018, IMPALA, arXiv:1802.01561), truncation-correct.
//
//   ratio[t]  = exp(target_log_prob[t] - behavior_log_prob[t])
//   rho[t]    = min(rho_bar, ratio[t]);   c[t] = min(c_bar, ratio[t])
//   delta[t]  = rho[t] * (reward[t] + (terminated[t] ? 0 : gamma * next_value[t]) - value[t])
//   acc[t]    = delta[t] + (done[t] ? 0 : gamma * c[t] * acc[t + 1])
//   value_target[t] = value[t] + acc[t]
//   next_vs[t]      = (done[t] or t == T - 1) ? next_value[t] : value_target[t + 1]
//   pg_advantage[t] = rho[t] * (reward[t] + (terminated[t] ? 0 : gamma * next_vs[t]) - value[t])
//
// The outputs are regression and policy-gradient targets: the op is not differentiable.
#pragma once

#include <cmath>
#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/tensor_utils.h"

namespace nostall {

template <typename S>
NOSTALL_HD inline S clipped(S ratio, S bar) {
  return ratio < bar ? ratio : bar;
}

template <typename S>
NOSTALL_HD inline S bootstrapped_td(S reward, S value, S next, bool terminated, S gamma) {
  return reward + zero_if(terminated, gamma * next) - value;
}

inline void check_vtrace_args(const Tensor& behavior_log_prob, const Tensor& target_log_prob,
                              const Tensor& reward, const Tensor& value, const Tensor& next_value,
                              const Tensor& done, const Tensor& terminated, double gamma,
                              double rho_bar, double c_bar) {
  check_time_major(reward, "reward");
  check_like(behavior_log_prob, "behavior_log_prob", reward, "reward");
  check_like(target_log_prob, "target_log_prob", reward, "reward");
  check_like(value, "value", reward, "reward");
  check_like(next_value, "next_value", reward, "reward");
  check_flags(done, "done", reward, "reward");
  check_flags(terminated, "terminated", reward, "reward");
  check_unit_interval(gamma, "gamma");
  check_positive(rho_bar, "rho_bar");
  check_positive(c_bar, "c_bar");
}

std::tuple<Tensor, Tensor> vtrace_cpu(Tensor behavior_log_prob, Tensor target_log_prob,
                                      Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                      Tensor terminated, double gamma, double rho_bar,
                                      double c_bar);
std::tuple<Tensor, Tensor> vtrace_cuda(Tensor behavior_log_prob, Tensor target_log_prob,
                                       Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                       Tensor terminated, double gamma, double rho_bar,
                                       double c_bar);

}  // namespace nostall
