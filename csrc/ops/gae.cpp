// CPU kernels for gae and its adjoint. Each parallel chunk owns a band of columns and walks the
// rows in time order (backward for the forward op, forward for the adjoint), so every inner loop
// runs over contiguous memory and vectorises.
#include "ops/gae.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

#include "common/cpu_loops.h"
#include "common/stream_store.h"

namespace nostall {

using torch::stable::empty_like;

namespace {

// Rows backward in time over columns [n0, n1). The inner loops are branch-free over contiguous
// memory, so they vectorise; the last row, which has no successor, is peeled off.
template <typename S>
void gae_band(const S* __restrict__ r, const S* __restrict__ v, const S* __restrict__ nv,
              const bool* __restrict__ d, const bool* __restrict__ term, S* __restrict__ adv,
              S* __restrict__ vt, int64_t T, int64_t N, int64_t n0, int64_t n1, S g, S gl) {
  for (int64_t i = (T - 1) * N + n0; i < (T - 1) * N + n1; ++i) {
    adv[i] = gae_step(r[i], v[i], nv[i], d[i], term[i], g, gl, S(0));
    vt[i] = adv[i] + v[i];
  }
  for (int64_t t = T - 2; t >= 0; --t) {
    const S* __restrict__ next_adv = adv + (t + 1) * N;
    for (int64_t i = t * N + n0, n = n0; n < n1; ++i, ++n) {
      const S a = gae_step(r[i], v[i], nv[i], d[i], term[i], g, gl, next_adv[n]);
      adv[i] = a;
      vt[i] = a + v[i];
    }
  }
}

// The same recursion for outputs too large for the caches, where the op is memory-bound: each
// row's advantages are computed into `carry` (the band's width, cache-resident: the next row
// reads them from there), then streamed to `advantage` and `value_target` with non-temporal
// stores, which skip reading the output lines in before overwriting them (8 of the 30 bytes an
// element that plain stores move). The arithmetic is gae_band's, so the results are identical.
// Measured at (2048, 1024) float32 on a 2-core VM: 3-6% faster than plain stores, not the 27%
// the bytes alone predict (see benchmarks/RESULTS.md for the roofline).
template <typename S>
void gae_band_streaming(const S* __restrict__ r, const S* __restrict__ v, const S* __restrict__ nv,
                        const bool* __restrict__ d, const bool* __restrict__ term,
                        S* __restrict__ adv, S* __restrict__ vt, int64_t T, int64_t N, int64_t n0,
                        int64_t n1, S g, S gl) {
  const int64_t width = n1 - n0;
  std::vector<S> carry(static_cast<size_t>(width), S(0));  // advantage[t + 1]; 0 past T
  S* __restrict__ c = carry.data();
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t base = t * N + n0;
    for (int64_t n = 0; n < width; ++n) {
      const int64_t i = base + n;
      c[n] = gae_step(r[i], v[i], nv[i], d[i], term[i], g, gl, c[n]);
    }
    stream_copy(adv + base, c, width);
    stream_sum(vt + base, c, v + base, width);
  }
  stream_fence();
}

// Outputs of at least this many bytes each take the streaming kernel (past a core's share of
// the last-level cache; below it the next reader finds plain stores' lines still cached).
constexpr int64_t kStreamingBytes = int64_t{4} << 20;

// Rows forward in time: grad_delta[t] depends on grad_delta[t - 1], kept in grad_reward. The
// first row, which has no predecessor, is peeled off.
template <typename S>
void gae_backward_band(const S* __restrict__ ga, const S* __restrict__ gvt,
                       const bool* __restrict__ d, const bool* __restrict__ term,
                       S* __restrict__ gr, S* __restrict__ gv, S* __restrict__ gnv, int64_t T,
                       int64_t N, int64_t n0, int64_t n1, S g, S gl) {
  // value_target = advantage + value, so both output gradients flow into advantage.
  auto write = [&](int64_t i, S gd) {
    gr[i] = gd;
    gv[i] = gvt[i] - gd;
    gnv[i] = zero_if(term[i], g * gd);
  };
  for (int64_t i = n0; i < n1; ++i) {
    write(i, ga[i] + gvt[i]);
  }
  for (int64_t t = 1; t < T; ++t) {
    const S* __restrict__ prev_gd = gr + (t - 1) * N;
    const bool* __restrict__ prev_done = d + (t - 1) * N;
    for (int64_t i = t * N + n0, n = n0; n < n1; ++i, ++n) {
      write(i, gae_adjoint_step(ga[i] + gvt[i], prev_done[n], gl, prev_gd[n]));
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> gae_cpu(Tensor reward, Tensor value, Tensor next_value, Tensor done,
                                   Tensor terminated, double gamma, double lmbda) {
  check_gae_args(reward, value, next_value, done, terminated, gamma, lmbda);
  reward = as_contiguous(reward);
  value = as_contiguous(value);
  next_value = as_contiguous(next_value);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor advantage = empty_like(reward);
  Tensor value_target = empty_like(reward);
  const int64_t T = reward.size(0);
  const int64_t N = reward.size(1);
  dispatch_floating(reward.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* r = in_ptr<S>(reward);
    const S* v = in_ptr<S>(value);
    const S* nv = in_ptr<S>(next_value);
    const bool* d = done.const_data_ptr<bool>();
    const bool* term = terminated.const_data_ptr<bool>();
    S* adv = out_ptr<S>(advantage);
    S* vt = out_ptr<S>(value_target);
    const S g = static_cast<S>(gamma);
    const S gl = static_cast<S>(gamma * lmbda);
    const bool streaming = T * N * static_cast<int64_t>(sizeof(S)) >= kStreamingBytes;
    for_column_bands(N, T, [&](int64_t n0, int64_t n1) {
      if (streaming) {
        gae_band_streaming(r, v, nv, d, term, adv, vt, T, N, n0, n1, g, gl);
      } else {
        gae_band(r, v, nv, d, term, adv, vt, T, N, n0, n1, g, gl);
      }
    });
  });
  return {advantage, value_target};
}

std::tuple<Tensor, Tensor, Tensor> gae_backward_cpu(Tensor grad_advantage, Tensor grad_value_target,
                                                    Tensor done, Tensor terminated, double gamma,
                                                    double lmbda) {
  check_gae_backward_args(grad_advantage, grad_value_target, done, terminated, gamma, lmbda);
  grad_advantage = as_contiguous(grad_advantage);
  grad_value_target = as_contiguous(grad_value_target);
  done = as_contiguous(done);
  terminated = as_contiguous(terminated);
  Tensor grad_reward = empty_like(grad_advantage);
  Tensor grad_value = empty_like(grad_advantage);
  Tensor grad_next_value = empty_like(grad_advantage);
  const int64_t T = grad_advantage.size(0);
  const int64_t N = grad_advantage.size(1);
  dispatch_floating(grad_advantage.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* ga = in_ptr<S>(grad_advantage);
    const S* gvt = in_ptr<S>(grad_value_target);
    const bool* d = done.const_data_ptr<bool>();
    const bool* term = terminated.const_data_ptr<bool>();
    S* gr = out_ptr<S>(grad_reward);
    S* gv = out_ptr<S>(grad_value);
    S* gnv = out_ptr<S>(grad_next_value);
    const S g = static_cast<S>(gamma);
    const S gl = static_cast<S>(gamma * lmbda);
    for_column_bands(N, T, [&](int64_t n0, int64_t n1) {
      gae_backward_band(ga, gvt, d, term, gr, gv, gnv, T, N, n0, n1, g, gl);
    });
  });
  return {grad_reward, grad_value, grad_next_value};
}

}  // namespace nostall
