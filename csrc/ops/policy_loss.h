// The PPO / GRPO clipped surrogate objective over [B, T] token log-probabilities, aggregated
// into one scalar, with the clip fraction and the approximate KL from the same pass.
//
//   ratio      = exp(log_prob - old_log_prob)
//   per_token  = -min(ratio * A, clamp(ratio, 1 - clip_low, 1 + clip_high) * A)
//   dual clip  (Ye et al. 2020, arXiv:1912.09729), for A < 0: per_token = min(per_token, -c * A)
//   truncated importance weight against the behaviour policy (asynchronous data):
//              per_token *= min(exp(old_log_prob - behavior_log_prob), is_cap)   (a constant)
//
// Aggregation over the mask (bool [B, T]; masked tokens count as absent, even when NaN):
//   token_mean               sum(per_token) / max(#tokens, 1)
//   seq_mean_token_mean      mean over sequences of sum_t(per_token) / max(#tokens_b, 1)  (GRPO)
//   seq_mean_token_sum_norm  sum(per_token) / (B * max_tokens)                          (Dr. GRPO)
// clip_fraction: the share of tokens whose gradient a clip cuts; approx_kl: the token mean of
// (ratio - 1) - log(ratio), the k3 estimator of KL(old || new). Only log_prob is differentiated:
// the advantage and the log-probabilities of earlier policies are targets.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"

namespace nostall {

enum class Aggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSumNorm };

inline Aggregation parse_aggregation(const std::string& aggregation) {
  if (aggregation == "token_mean") return Aggregation::kTokenMean;
  if (aggregation == "seq_mean_token_mean") return Aggregation::kSeqMeanTokenMean;
  STD_TORCH_CHECK(aggregation == "seq_mean_token_sum_norm",
                  "aggregation must be 'token_mean', 'seq_mean_token_mean' or "
                  "'seq_mean_token_sum_norm', got '",
                  aggregation, "'");
  return Aggregation::kSeqMeanTokenSumNorm;
}

// Scalar arguments, resolved once per call.
struct ClipConfig {
  double lo, hi;  // the ratio's clip range [1 - clip_low, 1 + clip_high]
  bool dual;
  double dual_clip;
  bool truncated_is;
  double is_cap;
  Aggregation aggregation;
  int64_t max_tokens;
};

inline ClipConfig clip_config(double clip_low, double clip_high,
                              const std::optional<double>& dual_clip, bool has_behavior,
                              double is_cap, const std::string& aggregation, int64_t max_tokens) {
  STD_TORCH_CHECK(clip_low >= 0.0 && std::isfinite(clip_low),
                  "clip_low must be a finite number >= 0, got ", clip_low);
  STD_TORCH_CHECK(clip_high >= 0.0 && std::isfinite(clip_high),
                  "clip_high must be a finite number >= 0, got ", clip_high);
  STD_TORCH_CHECK(!dual_clip.has_value() || (*dual_clip > 1.0 && std::isfinite(*dual_clip)),
                  "dual_clip must be a finite number > 1, got ", dual_clip.value_or(0.0));
  STD_TORCH_CHECK(is_cap > 0.0 && std::isfinite(is_cap), "is_cap must be a finite number > 0, got ",
                  is_cap);
  const Aggregation mode = parse_aggregation(aggregation);
  STD_TORCH_CHECK(max_tokens >= 1, "max_tokens must be >= 1, got ", max_tokens);
  return {1.0 - clip_low,
          1.0 + clip_high,
          dual_clip.has_value(),
          dual_clip.value_or(0.0),
          has_behavior,
          is_cap,
          mode,
          max_tokens};
}

inline void check_token_values(const Tensor& t, const char* name, const Tensor& ref,
                               const char* ref_name) {
  STD_TORCH_CHECK(t.dim() == 2 && t.size(0) == ref.size(0) && t.size(1) == ref.size(1), name,
                  " must be [B, T] = [", ref.size(0), ", ", ref.size(1), "], matching ", ref_name);
  STD_TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have the dtype of ", ref_name,
                  " (", torch::headeronly::toString(ref.scalar_type()), "), got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.device() == ref.device(), name, " must be on the device of ", ref_name);
}

inline void check_policy_loss_args(const Tensor& log_prob, const Tensor& old_log_prob,
                                   const Tensor& advantage, const Tensor& mask,
                                   const std::optional<Tensor>& behavior_log_prob) {
  STD_TORCH_CHECK(log_prob.dim() == 2, "log_prob must be [B, T], got ", log_prob.dim(),
                  " dimensions");
  STD_TORCH_CHECK(is_floating(log_prob), "log_prob must be float32 or float64, got ",
                  torch::headeronly::toString(log_prob.scalar_type()));
  STD_TORCH_CHECK(log_prob.size(0) >= 1 && log_prob.size(1) >= 1,
                  "log_prob must have B >= 1 and T >= 1, got [", log_prob.size(0), ", ",
                  log_prob.size(1), "]");
  check_token_values(old_log_prob, "old_log_prob", log_prob, "log_prob");
  if (behavior_log_prob.has_value()) {
    check_token_values(*behavior_log_prob, "behavior_log_prob", log_prob, "log_prob");
  }
  STD_TORCH_CHECK(advantage.dim() == 1 || advantage.dim() == 2,
                  "advantage must be [B] (one per sequence) or [B, T] (one per token), got ",
                  advantage.dim(), " dimensions");
  STD_TORCH_CHECK(advantage.size(0) == log_prob.size(0) &&
                      (advantage.dim() == 1 || advantage.size(1) == log_prob.size(1)),
                  "advantage must be [B] = [", log_prob.size(0), "] or [B, T] = [",
                  log_prob.size(0), ", ", log_prob.size(1), "], matching log_prob");
  STD_TORCH_CHECK(advantage.scalar_type() == log_prob.scalar_type(),
                  "advantage must have the dtype of log_prob (",
                  torch::headeronly::toString(log_prob.scalar_type()), "), got ",
                  torch::headeronly::toString(advantage.scalar_type()));
  STD_TORCH_CHECK(advantage.device() == log_prob.device(),
                  "advantage must be on the device of log_prob");
  STD_TORCH_CHECK(mask.scalar_type() == ScalarType::Bool, "mask must be bool, got ",
                  torch::headeronly::toString(mask.scalar_type()));
  STD_TORCH_CHECK(
      mask.dim() == 2 && mask.size(0) == log_prob.size(0) && mask.size(1) == log_prob.size(1),
      "mask must be [B, T] = [", log_prob.size(0), ", ", log_prob.size(1), "], matching log_prob");
  STD_TORCH_CHECK(mask.device() == log_prob.device(), "mask must be on the device of log_prob");
}

// Checks every argument (tensors first, then scalars, as the fake kernel does) and resolves the
// scalar ones.
inline ClipConfig checked_clip_config(const Tensor& log_prob, const Tensor& old_log_prob,
                                      const Tensor& advantage, const Tensor& mask,
                                      const std::optional<Tensor>& behavior_log_prob,
                                      double clip_low, double clip_high,
                                      const std::optional<double>& dual_clip, double is_cap,
                                      const std::string& aggregation, int64_t max_tokens) {
  check_policy_loss_args(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  return clip_config(clip_low, clip_high, dual_clip, behavior_log_prob.has_value(), is_cap,
                     aggregation, max_tokens);
}

// The forward's outputs, allocated like log_prob: three scalars and the contiguous [B, T]
// per-token derivatives.
// Hidden, as the stable ABI's Tensor it holds is: a struct more visible than its fields draws
// -Wattributes (it never crosses the library's boundary).
struct __attribute__((visibility("hidden"))) LossOutputs {
  Tensor loss, clip_fraction, approx_kl, token_grad;

  explicit LossOutputs(const Tensor& log_prob)
      : loss(torch::stable::new_empty(log_prob, {})),
        clip_fraction(torch::stable::new_empty(log_prob, {})),
        approx_kl(torch::stable::new_empty(log_prob, {})),
        token_grad(torch::stable::new_empty(log_prob, {log_prob.size(0), log_prob.size(1)})) {}

  std::tuple<Tensor, Tensor, Tensor, Tensor> tuple() const {
    return {loss, clip_fraction, approx_kl, token_grad};
  }
};

NOSTALL_HD inline float exp_of(float x) { return expf(x); }
NOSTALL_HD inline double exp_of(double x) { return exp(x); }

template <typename S>
struct TokenTerms {
  S loss;   // the token's (weighted) surrogate loss
  S dloss;  // its derivative in log_prob
  bool clipped;
  S kl;  // (ratio - 1) - log(ratio)
};

// One token's terms from its log-ratio and ratio = exp(log_ratio); the caller has already
// excluded masked tokens. `is_weight` is 1 without a behaviour policy. NaN in log_prob reaches
// the loss (no clip selects it away).
template <typename S>
NOSTALL_HD inline TokenTerms<S> clipped_token_from_ratio(S log_ratio, S ratio, S adv, S is_weight,
                                                         const ClipConfig& cfg) {
  const S lo = static_cast<S>(cfg.lo);
  const S hi = static_cast<S>(cfg.hi);
  const S clipped_ratio = ratio < lo ? lo : (ratio > hi ? hi : ratio);
  const S unclipped_term = ratio * adv;
  const bool unclipped = unclipped_term <= clipped_ratio * adv;
  // d(-ratio * A) / d log_prob = -ratio * A; the clipped branch is constant in log_prob.
  S loss = unclipped ? -unclipped_term : -clipped_ratio * adv;
  S dloss = unclipped ? -unclipped_term : S(0);
  bool clipped = (ratio < lo && adv < S(0)) || (ratio > hi && adv > S(0));
  if (cfg.dual && adv < S(0)) {
    const S cap = -adv * static_cast<S>(cfg.dual_clip);
    if (loss > cap) {
      loss = cap;
      dloss = S(0);
      clipped = true;
    }
  }
  return {loss * is_weight, dloss * is_weight, clipped, (ratio - S(1)) - log_ratio};
}

template <typename S>
NOSTALL_HD inline TokenTerms<S> clipped_token(S log_prob, S old_log_prob, S adv, S is_weight,
                                              const ClipConfig& cfg) {
  const S log_ratio = log_prob - old_log_prob;
  return clipped_token_from_ratio(log_ratio, exp_of(log_ratio), adv, is_weight, cfg);
}

// The truncated importance weight from w = exp(old_log_prob - behavior_log_prob).
template <typename S>
NOSTALL_HD inline S truncate_is_weight(S w, const ClipConfig& c) {
  const S cap = static_cast<S>(c.is_cap);
  return w < cap ? w : cap;
}

// min(exp(old_log_prob - behavior_log_prob), is_cap): treated as a constant.
template <typename S>
NOSTALL_HD inline S truncated_is_weight(S old_log_prob, S behavior_log_prob, const ClipConfig& c) {
  return truncate_is_weight(exp_of(old_log_prob - behavior_log_prob), c);
}

// Per-sequence sums the aggregation needs; row b of a [B, kRowSums] float64 table.
constexpr int kRowSums = 4;  // loss, tokens, clipped tokens, kl

// The loss's weight of sequence b's token sum, given the row and total token counts.
NOSTALL_HD inline double sequence_weight(const ClipConfig& c, int64_t B, double row_tokens,
                                         double total_tokens) {
  switch (c.aggregation) {
    case Aggregation::kTokenMean:
      return 1.0 / (total_tokens > 1.0 ? total_tokens : 1.0);
    case Aggregation::kSeqMeanTokenMean:
      return 1.0 / (static_cast<double>(B) * (row_tokens > 1.0 ? row_tokens : 1.0));
    default:
      return 1.0 / (static_cast<double>(B) * static_cast<double>(c.max_tokens));
  }
}

inline void check_policy_loss_backward_args(const Tensor& grad_loss, const Tensor& token_grad,
                                            const Tensor& mask, const std::string& aggregation,
                                            int64_t max_tokens) {
  STD_TORCH_CHECK(token_grad.dim() == 2 && is_floating(token_grad),
                  "token_grad must be a float32 or float64 [B, T] tensor");
  STD_TORCH_CHECK(grad_loss.dim() == 0 && grad_loss.scalar_type() == token_grad.scalar_type(),
                  "grad_loss must be a scalar tensor with the dtype of token_grad");
  STD_TORCH_CHECK(grad_loss.device() == token_grad.device(),
                  "grad_loss must be on the device of token_grad");
  STD_TORCH_CHECK(mask.scalar_type() == ScalarType::Bool, "mask must be bool, got ",
                  torch::headeronly::toString(mask.scalar_type()));
  STD_TORCH_CHECK(
      mask.dim() == 2 && mask.size(0) == token_grad.size(0) && mask.size(1) == token_grad.size(1),
      "mask must have the shape of token_grad");
  STD_TORCH_CHECK(mask.device() == token_grad.device(), "mask must be on the device of token_grad");
  parse_aggregation(aggregation);
  STD_TORCH_CHECK(max_tokens >= 1, "max_tokens must be >= 1, got ", max_tokens);
}

// The aggregation alone, for the backward (the clip settings are already in token_grad).
inline ClipConfig aggregation_config(const std::string& aggregation, int64_t max_tokens) {
  return {0.0, 0.0, false, 0.0, false, 1.0, parse_aggregation(aggregation), max_tokens};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> clipped_policy_loss_cpu(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap);
Tensor clipped_policy_loss_backward_cpu(Tensor grad_loss, Tensor token_grad, Tensor mask,
                                        std::string aggregation, int64_t max_tokens);
std::tuple<Tensor, Tensor, Tensor, Tensor> clipped_policy_loss_cuda(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap);
Tensor clipped_policy_loss_backward_cuda(Tensor grad_loss, Tensor token_grad, Tensor mask,
                                         std::string aggregation, int64_t max_tokens);

}  // namespace nostall
