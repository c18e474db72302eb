// CPU kernel for vtrace: column bands in parallel, rows walked backward in time.
#include "ops/vtrace.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

#include "common/cpu_loops.h"

namespace nostall {

using torch::stable::empty_like;

std::tuple<Tensor, Tensor> vtrace_cpu(Tensor behavior_log_prob, Tensor target_log_prob,
                                      Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                      Tensor terminated, double gamma, double rho_bar,
                                      double c_bar) {
  check_vtrace_args(behavior_log_prob, target_log_prob, reward, value, next_value, done, terminated,
                    gamma, rho_bar, c_bar);
  behavior_log_prob = as_contiguous(behavior_log_prob);
  target_log_prob = as_contiguous(target_log_prob);
  reward = as_contiguous(reward);
  value = as_contiguous(value);
  next_value = as_contiguous(next_value);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor value_target = empty_like(reward);
  Tensor pg_advantage = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* blp = in_ptr<S>(behavior_log_prob);
    const S* tlp = in_ptr<S>(target_log_prob);
    const S* r = in_ptr<S>(reward);
    const S* v = in_ptr<S>(value);
    const S* nv = in_ptr<S>(next_value);
    const bool* d = done.const_data_ptr<bool>();
    const bool* term = terminated.const_data_ptr<bool>();
    S* vs = out_ptr<S>(value_target);
    S* pg = out_ptr<S>(pg_advantage);
    const S g = static_cast<S>(gamma);
    const S rb = static_cast<S>(rho_bar);
    const S cb = static_cast<S>(c_bar);
    for_column_bands(N, T, [&](int64_t n0, int64_t n1) {
      // acc[t + 1] per column of this band: value_target - value, kept apart to avoid rounding.
      std::vector<S> acc(static_cast<size_t>(n1 - n0), S(0));
      for (int64_t t = T - 1; t >= 0; --t) {
        const int64_t row = t * N;
        const bool last = t == T - 1;
        for (int64_t n = n0; n < n1; ++n) {
          const int64_t i = row + n;
          const S ratio = std::exp(tlp[i] - blp[i]);
          const S rho = clipped(ratio, rb);
          const S c = clipped(ratio, cb);
          const S delta = rho * bootstrapped_td(r[i], v[i], nv[i], term[i], g);
          const bool cut = last || d[i];
          S& a = acc[n - n0];
          a = delta + (cut ? S(0) : g * c * a);
          vs[i] = a + v[i];
          const S next_vs = cut ? nv[i] : vs[i + N];
          pg[i] = rho * bootstrapped_td(r[i], v[i], next_vs, term[i], g);
        }
      }
    });
  });
  return {value_target, pg_advantage};
}

}  // namespace nostall
