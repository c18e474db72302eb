// CUDA kernel of sample_tokens (see sample_tokens.h): one block per row, on the current stream.
// Every reduction is a block reduction; the top-k / top-p threshold is found by bisection on the
// value (each step one counting pass) and then snapped to the smallest kept value, so the kept
// set is the CPU kernel's: every allowed x at or above the threshold.
#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "common/cuda_launch.cuh"
#include "common/dispatch.h"
#include "common/tensor_utils.h"
#include "ops/sample_tokens.h"

namespace nostall {

namespace {

constexpr int kRowThreads = 256;
constexpr int kBisectionSteps = 64;

template <typename S>
struct Row {
  const S* x;
  int64_t xs;
  const bool* allowed;
  int64_t V;
  S inv_t;
  __device__ S at(int64_t v) const { return x[v * xs] * inv_t; }
};

// Block reductions over kRowThreads threads; every thread gets the result.
template <typename S, typename Op>
__device__ S block_reduce(S value, Op op, S* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const S out = shared[0];
  __syncthreads();
  return out;
}

template <typename S>
__device__ S max_kept(const Row<S>& r, S threshold, S* shared) {
  S m = -INFINITY;
  for (int64_t v = threadIdx.x; v < r.V; v += kRowThreads) {
    const S xv = r.at(v);
    if (r.allowed[v] && xv >= threshold && xv > m) m = xv;
  }
  return block_reduce(m, [](S a, S b) { return a > b ? a : b; }, shared);
}

// The smallest allowed x at or above lo (snaps a bisection bound to a value of the row).
template <typename S>
__device__ S min_at_or_above(const Row<S>& r, S lo, S* shared) {
  S m = INFINITY;
  for (int64_t v = threadIdx.x; v < r.V; v += kRowThreads) {
    const S xv = r.at(v);
    if (r.allowed[v] && xv >= lo && xv < m) m = xv;
  }
  return block_reduce(m, [](S a, S b) { return a < b ? a : b; }, shared);
}

// sum over allowed x >= t of weight(x): count (weight 1) or mass (exp(x - m)).
template <typename S>
__device__ S mass_at_or_above(const Row<S>& r, S t, bool count, S m, S* shared) {
  S sum = S(0);
  for (int64_t v = threadIdx.x; v < r.V; v += kRowThreads) {
    const S xv = r.at(v);
    if (r.allowed[v] && xv >= t) sum += count ? S(1) : exp(xv - m);
  }
  return block_reduce(sum, [](S a, S b) { return a + b; }, shared);
}

// The largest threshold t with mass(t) >= target, given mass(lo) >= target.
template <typename S>
__device__ S bisect(const Row<S>& r, S lo, S hi, S target, bool count, S m, S* shared) {
  if (mass_at_or_above(r, hi, count, m, shared) >= target) return hi;
  for (int i = 0; i < kBisectionSteps; ++i) {
    const S mid = lo + (hi - lo) / S(2);
    if (!(mid > lo && mid < hi)) break;
    if (mass_at_or_above(r, mid, count, m, shared) >= target) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return min_at_or_above(r, lo, shared);
}

template <typename S>
__global__ void sample_tokens_kernel(const S* x, int64_t xs0, int64_t xs1, const S* u, int64_t us0,
                                     int64_t us1, const bool* allowed, int64_t V, S inv_t,
                                     int64_t top_k, double top_p, int64_t eos, int64_t pad,
                                     bool* finished, int64_t* token, S* log_prob) {
  __shared__ S shared[kRowThreads];
  __shared__ int64_t shared_index[kRowThreads];
  const int64_t b = blockIdx.x;
  if (finished[b]) {  // uniform across the block: every thread returns together
    if (threadIdx.x == 0) {
      token[b] = pad;
      log_prob[b] = S(0);
    }
    return;
  }
  const Row<S> r{x + b * xs0, xs1, allowed, V, inv_t};
  const S m = max_kept(r, S(-INFINITY), shared);
  S threshold = -INFINITY;
  if (top_k > 0) {
    const S n = mass_at_or_above(r, S(-INFINITY), true, m, shared);
    if (S(top_k) < n) {
      threshold = bisect(r, min_at_or_above(r, S(-INFINITY), shared), m, S(top_k), true, m, shared);
    }
  }
  if (top_p < 1.0) {
    const S total = mass_at_or_above(r, threshold, false, m, shared);
    const S lo = threshold == S(-INFINITY) ? min_at_or_above(r, S(-INFINITY), shared) : threshold;
    threshold = bisect(r, lo, m, static_cast<S>(top_p) * total, false, m, shared);
  }
  // Gumbel-max over the kept values, ties to the lowest index; and the logsumexp of every
  // allowed value: the log-prob is the untruncated policy's, as a trainer computes it.
  S best_score = -INFINITY;
  int64_t best = V;
  S sum = S(0);
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const S xv = r.at(v);
    if (!allowed[v] || !(xv >= S(-INFINITY))) continue;  // (NaN logits left out)
    sum += exp(xv - m);
    if (!(xv >= threshold)) continue;
    S uv = u[b * us0 + v * us1];
    uv = uv < S(1e-20) ? S(1e-20) : uv;
    const S score = xv - log(-log(uv));
    if (best == V || score > best_score) {
      best = v;
      best_score = score;
    }
  }
  shared[threadIdx.x] = best_score;
  shared_index[threadIdx.x] = best;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const S other = shared[threadIdx.x + stride];
      const int64_t other_index = shared_index[threadIdx.x + stride];
      const bool better =
          other_index < V &&
          (shared_index[threadIdx.x] == V || other > shared[threadIdx.x] ||
           (other == shared[threadIdx.x] && other_index < shared_index[threadIdx.x]));
      if (better) {
        shared[threadIdx.x] = other;
        shared_index[threadIdx.x] = other_index;
      }
    }
    __syncthreads();
  }
  const int64_t chosen = shared_index[0];
  __syncthreads();
  const S total = block_reduce(sum, [](S a, S c) { return a + c; }, shared);
  if (threadIdx.x == 0) {
    if (chosen == V) {  // nothing allowed, or NaN logits: a clear sign, not a token
      token[b] = pad;
      log_prob[b] = S(NAN);
    } else {
      token[b] = chosen;
      log_prob[b] = r.at(chosen) - (m + log(total));
      if (chosen == eos) finished[b] = true;
    }
  }
}

}  // namespace

SampleTokensOutput sample_tokens_cuda(Tensor logits, Tensor uniform, Tensor finished,
                                      Tensor allowed, double temperature, int64_t top_k,
                                      double top_p, int64_t eos_token_id, int64_t pad_token_id) {
  check_sample_tokens_args(logits, uniform, finished, allowed, temperature, top_k, top_p,
                           eos_token_id, pad_token_id);
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  const int64_t B = logits.size(0), V = logits.size(1);
  Tensor token = torch::stable::new_empty(logits, {B}, ScalarType::Long);
  Tensor log_prob = new_contiguous(logits, {B});
  if (B == 0) return {token, log_prob};
  Tensor done = as_contiguous(finished);
  Tensor allowed_c = as_contiguous(allowed);
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    sample_tokens_kernel<S><<<static_cast<unsigned>(B), kRowThreads, 0, current_stream(logits)>>>(
        logits.const_data_ptr<S>(), logits.stride(0), logits.stride(1), uniform.const_data_ptr<S>(),
        uniform.stride(0), uniform.stride(1), allowed_c.const_data_ptr<bool>(), V,
        static_cast<S>(1.0 / temperature), top_k, top_p, eos_token_id, pad_token_id,
        done.mutable_data_ptr<bool>(), token.mutable_data_ptr<int64_t>(),
        log_prob.mutable_data_ptr<S>());
  });
  check_launch("sample_tokens");
  if (!finished.is_contiguous()) torch::stable::copy_(finished, done);  // a strided view
  return {token, log_prob};
}

}  // namespace nostall
