// CPU kernel of sample_tokens (see sample_tokens.h): rows in parallel; the top-k / top-p
// threshold found exactly by selecting and sorting the row's kept values.
#include "ops/sample_tokens.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "common/dispatch.h"
#include "common/tensor_utils.h"

namespace nostall {

namespace {

// The smallest x a row keeps: -inf without truncation, else the top-k / top-p threshold.
template <typename S>
S keep_threshold(std::vector<S>& values, int64_t top_k, double top_p) {
  const S neg_inf = -std::numeric_limits<S>::infinity();
  const int64_t n = static_cast<int64_t>(values.size());
  S threshold = neg_inf;
  if (top_k > 0 && top_k < n) {
    std::nth_element(values.begin(), values.begin() + (top_k - 1), values.end(), std::greater<S>());
    threshold = values[top_k - 1];
    // Ties at the k-th value are kept: the kept set is every value >= threshold.
    values.erase(std::remove_if(values.begin(), values.end(), [&](S v) { return v < threshold; }),
                 values.end());
  }
  if (top_p < 1.0 && values.size() > 1) {
    std::sort(values.begin(), values.end(), std::greater<S>());
    // In double: the scan must reach the total it is a share of (float rounding in the running
    // sum could otherwise miss it when top_p is within an ulp of 1).
    double sum = 0.0;
    for (S v : values) sum += std::exp(static_cast<double>(v - values[0]));
    const double target = top_p * sum;
    double mass = 0.0;
    threshold = std::max(threshold, values.back());  // reached at the last value at the latest
    for (S v : values) {  // the first value at which the mass reaches top_p is the last kept
      mass += std::exp(static_cast<double>(v - values[0]));
      if (mass >= target) {
        threshold = std::max(threshold, v);
        break;
      }
    }
  }
  return threshold;
}

template <typename S>
void sample_row(const S* x, int64_t xs, const S* u, int64_t us, const bool* allowed, int64_t V,
                S inv_temperature, int64_t top_k, double top_p, int64_t eos, int64_t pad,
                bool* finished, int64_t* token, S* log_prob, std::vector<S>& scratch) {
  if (*finished) {
    *token = pad;
    *log_prob = S(0);
    return;
  }
  const S neg_inf = -std::numeric_limits<S>::infinity();
  S threshold = neg_inf;
  if (top_k > 0 || top_p < 1.0) {
    scratch.clear();
    for (int64_t v = 0; v < V; ++v) {
      if (allowed[v]) scratch.push_back(x[v * xs] * inv_temperature);
    }
    threshold = keep_threshold(scratch, top_k, top_p);
  }
  int64_t best = -1;
  S best_score = neg_inf, best_x = neg_inf, m = neg_inf;
  for (int64_t v = 0; v < V; ++v) {
    const S xv = x[v * xs] * inv_temperature;
    if (!allowed[v] || xv < threshold) continue;
    S uv = u[v * us];
    uv = uv < S(1e-20) ? S(1e-20) : uv;
    const S score = xv - std::log(-std::log(uv));
    if (best < 0 || score > best_score) {  // strict: ties keep the lowest index
      best = v;
      best_score = score;
      best_x = xv;
    }
    m = xv > m ? xv : m;
  }
  if (best < 0) {  // nothing allowed (or every allowed logit NaN): a clear sign, not a token
    *token = pad;
    *log_prob = std::numeric_limits<S>::quiet_NaN();
    return;
  }
  // The log-prob is the untruncated policy's (every allowed token), as a trainer computes it
  // from the same logits: truncation chooses which token is drawn, not its recorded probability.
  S sum = S(0);
  for (int64_t v = 0; v < V; ++v) {
    const S xv = x[v * xs] * inv_temperature;
    if (allowed[v] && xv >= neg_inf) sum += std::exp(xv - m);  // (NaN logits left out)
  }
  *token = best;
  *log_prob = best_x - (m + std::log(sum));
  if (best == eos) *finished = true;
}

}  // namespace

SampleTokensOutput sample_tokens_cpu(Tensor logits, Tensor uniform, Tensor finished, Tensor allowed,
                                     double temperature, int64_t top_k, double top_p,
                                     int64_t eos_token_id, int64_t pad_token_id) {
  check_sample_tokens_args(logits, uniform, finished, allowed, temperature, top_k, top_p,
                           eos_token_id, pad_token_id);
  const int64_t B = logits.size(0), V = logits.size(1);
  Tensor token = torch::stable::new_empty(logits, {B}, ScalarType::Long);
  Tensor log_prob = new_contiguous(logits, {B});
  Tensor done = as_contiguous(finished);
  Tensor allowed_c = as_contiguous(allowed);
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* x = logits.const_data_ptr<S>();
    const S* u = uniform.const_data_ptr<S>();
    const bool* ok = allowed_c.const_data_ptr<bool>();
    bool* fin = done.mutable_data_ptr<bool>();
    int64_t* tok = token.mutable_data_ptr<int64_t>();
    S* lp = log_prob.mutable_data_ptr<S>();
    const int64_t xs0 = logits.stride(0), xs1 = logits.stride(1);
    const int64_t us0 = uniform.stride(0), us1 = uniform.stride(1);
    const S inv_t = static_cast<S>(1.0 / temperature);
    const int64_t grain = V >= 4096 ? 1 : (int64_t{1} << 14) / V + 1;
    torch::stable::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      std::vector<S> scratch;
      for (int64_t b = b0; b < b1; ++b) {
        sample_row(x + b * xs0, xs1, u + b * us0, us1, ok, V, inv_t, top_k, top_p, eos_token_id,
                   pad_token_id, fin + b, tok + b, lp + b, scratch);
      }
    });
  });
  if (!finished.is_contiguous()) torch::stable::copy_(finished, done);  // a strided view
  return {token, log_prob};
}

}  // namespace nostall
