// CPU kernels for discounted_returns and its adjoint, laid out like gae.cpp: column bands in
// parallel, rows in time order, contiguous inner loops.
#include "ops/discounted_returns.h"

#include <torch/csrc/stable/ops.h>

#include "common/cpu_loops.h"

namespace nostall {

using torch::stable::empty_like;

namespace {

// Rows backward in time; the last row (always cut) is peeled off so the inner loops vectorise.
template <typename S>
void returns_band(const S* __restrict__ r, const S* __restrict__ b, const bool* __restrict__ d,
                  const bool* __restrict__ term, S* __restrict__ ret, int64_t T, int64_t N,
                  int64_t n0, int64_t n1, S g) {
  for (int64_t i = (T - 1) * N + n0; i < (T - 1) * N + n1; ++i) {
    ret[i] = returns_step(r[i], b[i], true, term[i], g, S(0));
  }
  for (int64_t t = T - 2; t >= 0; --t) {
    const S* __restrict__ following = ret + (t + 1) * N;
    for (int64_t i = t * N + n0, n = n0; n < n1; ++i, ++n) {
      ret[i] = returns_step(r[i], b[i], d[i], term[i], g, following[n]);
    }
  }
}

// Rows forward in time: returns[t - 1] holds returns[t] with coefficient returns_discount(t - 1).
template <typename S>
void returns_backward_band(const S* __restrict__ gret, const bool* __restrict__ d,
                           const bool* __restrict__ term, S* __restrict__ gr, S* __restrict__ gb,
                           int64_t T, int64_t N, int64_t n0, int64_t n1, S g) {
  auto write = [&](int64_t i, S gx, bool cut) {
    gr[i] = gx;
    gb[i] = zero_if(!cut || term[i], g * gx);
  };
  for (int64_t t = 0; t < T; ++t) {
    const bool last = t == T - 1;
    if (t == 0) {
      for (int64_t i = n0; i < n1; ++i) write(i, gret[i], last || d[i]);
      continue;
    }
    const S* __restrict__ prev_gx = gr + (t - 1) * N;
    const bool* __restrict__ prev_done = d + (t - 1) * N;
    const bool* __restrict__ prev_term = term + (t - 1) * N;
    for (int64_t i = t * N + n0, n = n0; n < n1; ++i, ++n) {
      const S gx = gret[i] + returns_discount(prev_done[n], prev_term[n], g) * prev_gx[n];
      write(i, gx, last || d[i]);
    }
  }
}

}  // namespace

Tensor discounted_returns_cpu(Tensor reward, Tensor done, Tensor terminated, Tensor bootstrap_value,
                              double gamma) {
  check_discounted_returns_args(reward, done, terminated, bootstrap_value, gamma);
  reward = as_contiguous(reward);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  bootstrap_value = as_contiguous(bootstrap_value);
  Tensor returns = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* r = in_ptr<S>(reward);
    const S* b = in_ptr<S>(bootstrap_value);
    const bool* d = done.const_data_ptr<bool>();
    const bool* term = terminated.const_data_ptr<bool>();
    S* ret = out_ptr<S>(returns);
    const S g = static_cast<S>(gamma);
    for_column_bands(
        N, T, [&](int64_t n0, int64_t n1) { returns_band(r, b, d, term, ret, T, N, n0, n1, g); });
  });
  return returns;
}

std::tuple<Tensor, Tensor> discounted_returns_backward_cpu(Tensor grad_returns, Tensor done,
                                                           Tensor terminated, double gamma) {
  check_discounted_returns_backward_args(grad_returns, done, terminated, gamma);
  grad_returns = as_contiguous(grad_returns);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor grad_reward = empty_like(grad_returns);
  Tensor grad_bootstrap = empty_like(grad_returns);
  const int64_t T = grad_returns.size(0);
  const int64_t N = grad_returns.size(1);
  dispatch_floating(grad_returns.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* gret = in_ptr<S>(grad_returns);
    const bool* d = done.const_data_ptr<bool>();
    const bool* term = terminated.const_data_ptr<bool>();
    S* gr = out_ptr<S>(grad_reward);
    S* gb = out_ptr<S>(grad_bootstrap);
    const S g = static_cast<S>(gamma);
    for_column_bands(N, T, [&](int64_t n0, int64_t n1) {
      returns_backward_band(gret, d, term, gr, gb, T, N, n0, n1, g);
    });
  });
  return {grad_reward, grad_bootstrap};
}

}  // namespace nostall
