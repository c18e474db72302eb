// The whole PPO loss of a categorical actor-critic for one minibatch of M samples, in one pass
// (CleanRL's ppo.py, whose loss is two dozen small ops forward and as many backward):
//
//   log_p     = log_softmax(logits [M, A]);  new_lp = log_p[action];  H = -sum_a p log_p
//   adv       = (advantage - mean) / (std + 1e-8) when normalize_advantage (std: M - 1
//               denominator), else advantage
//   ratio     = exp(new_lp - old_log_prob)
//   pg        = -min(ratio adv, clamp(ratio, 1 - clip, 1 + clip) adv)
//   v_err     = (value - value_target)^2, or with value_clip c:
//               max(v_err, (old_value + clamp(value - old_value, -c, c) - value_target)^2)
//   loss      = mean(pg) - ent_coef mean(H) + vf_coef 0.5 mean(v_err)
//
// stats [5] = (mean(pg), 0.5 mean(v_err), mean(H), approx_kl, clip_fraction): approx_kl is the
// mean of (ratio - 1) - log(ratio), clip_fraction the share of samples whose policy gradient a
// clip cut (as clipped_policy_loss reports them). The forward also returns d loss / d logits
// [M, A] and d loss / d value [M]; the backward scales them by the incoming gradient:
//
//   d loss / d logits[k] = g_lp ([k == action] - p_k) + ent_coef / M p_k (log_p_k + H)
//   g_lp = -ratio adv / M where the unclipped term is the smaller (else 0)
//   d loss / d value = vf_coef / M (value - target), or through the clipped error where that is
//                      the larger (0 where the clamp is active)
//
// Only logits and value are differentiated; the rest are targets. An action outside [0, A) is
// an error on the CPU and gives NaN on CUDA (checking it there would need a host sync).
//
// ppo_loss_from_log_prob is the same loss for any policy distribution: it takes the new
// log-probabilities and entropies [M] (the caller's distribution computes them) instead of
// logits, and differentiates log_prob, entropy (d loss / d entropy = -ent_coef / M) and value.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/tensor_utils.h"

namespace nostall {

// Scalar arguments, resolved once per call.
struct PpoLossConfig {
  double clip_lo, clip_hi;
  bool value_clipped;
  double value_clip;
  double ent_coef, vf_coef;
  bool normalize;
};

// A per-sample [M] tensor matching `ref` (logits' rows, or log_prob) in length, dtype, device.
inline void check_ppo_sample_values(const Tensor& t, const char* name, const Tensor& ref,
                                    const char* ref_name) {
  STD_TORCH_CHECK(t.dim() == 1 && t.size(0) == ref.size(0), name, " must be [M] = [", ref.size(0),
                  "], one per ", ref.dim() == 2 ? "row of " : "sample of ", ref_name);
  STD_TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have the dtype of ", ref_name,
                  " (", torch::headeronly::toString(ref.scalar_type()), "), got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.device() == ref.device(), name, " must be on the device of ", ref_name);
}

// The checks shared by both variants once the policy's tensors are checked: the targets, the
// scalars. `ref` is logits or log_prob.
inline PpoLossConfig checked_ppo_targets_and_scalars(
    const Tensor& ref, const char* ref_name, const Tensor& value, const Tensor& old_log_prob,
    const Tensor& old_value, const Tensor& advantage, const Tensor& value_target, double clip_coef,
    const std::optional<double>& value_clip, double ent_coef, double vf_coef, bool normalize) {
  check_ppo_sample_values(value, "value", ref, ref_name);
  check_ppo_sample_values(old_log_prob, "old_log_prob", ref, ref_name);
  check_ppo_sample_values(old_value, "old_value", ref, ref_name);
  check_ppo_sample_values(advantage, "advantage", ref, ref_name);
  check_ppo_sample_values(value_target, "value_target", ref, ref_name);
  STD_TORCH_CHECK(!normalize || ref.size(0) >= 2,
                  "normalize_advantage needs at least 2 samples (the std of one is undefined)");
  STD_TORCH_CHECK(clip_coef >= 0.0 && std::isfinite(clip_coef),
                  "clip_coef must be a finite number >= 0, got ", clip_coef);
  STD_TORCH_CHECK(!value_clip.has_value() || (*value_clip >= 0.0 && std::isfinite(*value_clip)),
                  "value_clip must be None or a finite number >= 0, got ", value_clip.value_or(0));
  STD_TORCH_CHECK(std::isfinite(ent_coef), "ent_coef must be finite, got ", ent_coef);
  STD_TORCH_CHECK(std::isfinite(vf_coef), "vf_coef must be finite, got ", vf_coef);
  return {
      1.0 - clip_coef, 1.0 + clip_coef, value_clip.has_value(), value_clip.value_or(0.0), ent_coef,
      vf_coef,         normalize};
}

inline PpoLossConfig checked_ppo_loss_config(const Tensor& logits, const Tensor& action,
                                             const Tensor& value, const Tensor& old_log_prob,
                                             const Tensor& old_value, const Tensor& advantage,
                                             const Tensor& value_target, double clip_coef,
                                             const std::optional<double>& value_clip,
                                             double ent_coef, double vf_coef, bool normalize) {
  STD_TORCH_CHECK(logits.dim() == 2, "logits must be [M, A], got ", logits.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(logits), "logits must be float32 or float64, got ",
                  torch::headeronly::toString(logits.scalar_type()));
  STD_TORCH_CHECK(logits.size(0) >= 1 && logits.size(1) >= 1,
                  "logits must have M >= 1 and A >= 1, got [", logits.size(0), ", ", logits.size(1),
                  "]");
  STD_TORCH_CHECK(action.dim() == 1 && action.size(0) == logits.size(0) &&
                      action.scalar_type() == ScalarType::Long,
                  "action must be int64 [M] = [", logits.size(0), "]");
  STD_TORCH_CHECK(action.device() == logits.device(), "action must be on the device of logits");
  return checked_ppo_targets_and_scalars(logits, "logits", value, old_log_prob, old_value,
                                         advantage, value_target, clip_coef, value_clip, ent_coef,
                                         vf_coef, normalize);
}

inline PpoLossConfig checked_ppo_log_prob_config(const Tensor& log_prob, const Tensor& entropy,
                                                 const Tensor& value, const Tensor& old_log_prob,
                                                 const Tensor& old_value, const Tensor& advantage,
                                                 const Tensor& value_target, double clip_coef,
                                                 const std::optional<double>& value_clip,
                                                 double ent_coef, double vf_coef, bool normalize) {
  STD_TORCH_CHECK(log_prob.dim() == 1, "log_prob must be [M], got ", log_prob.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(log_prob), "log_prob must be float32 or float64, got ",
                  torch::headeronly::toString(log_prob.scalar_type()));
  STD_TORCH_CHECK(log_prob.size(0) >= 1, "log_prob must have M >= 1 samples");
  check_ppo_sample_values(entropy, "entropy", log_prob, "log_prob");
  return checked_ppo_targets_and_scalars(log_prob, "log_prob", value, old_log_prob, old_value,
                                         advantage, value_target, clip_coef, value_clip, ent_coef,
                                         vf_coef, normalize);
}

// The per-sample sums the loss and stats are made of.
struct PpoSums {
  double pg = 0, v_err = 0, entropy = 0, kl = 0, clipped = 0;
};

// The softmax of one row of logits into p, with its logsumexp and entropy (one exp per logit).
template <typename S>
NOSTALL_HD inline void ppo_softmax(const S* logits, int64_t A, S* p, S* lse, S* entropy) {
  using std::exp;
  using std::log;
  S m = logits[0];
  for (int64_t a = 1; a < A; ++a) m = logits[a] > m ? logits[a] : m;
  S sum = S(0);
  for (int64_t a = 0; a < A; ++a) {
    p[a] = exp(logits[a] - m);
    sum += p[a];
  }
  *lse = m + log(sum);
  const S inv_sum = S(1) / sum;
  S h = S(0);
  for (int64_t a = 0; a < A; ++a) {
    p[a] *= inv_sum;
    h -= p[a] * (logits[a] - *lse);
  }
  *entropy = h;
}

// The policy and value terms of one sample from its new log-probability and entropy: adds them
// to `sums`, writes d loss / d value and returns d loss / d new_lp (both scaled by 1 / M, from
// `inv_m`). adv_shift / adv_scale normalise the advantage (0 / 1 when off).
template <typename S>
NOSTALL_HD inline S ppo_terms(S new_lp, S entropy, S value, S old_lp, S old_value, S advantage,
                              S target, S adv_shift, S adv_scale, const PpoLossConfig& c, S inv_m,
                              S* grad_value, PpoSums& sums) {
  using std::exp;
  const S adv = (advantage - adv_shift) * adv_scale;
  const S log_ratio = new_lp - old_lp;
  const S ratio = exp(log_ratio);
  const S lo = S(c.clip_lo), hi = S(c.clip_hi);
  const S clipped_ratio = ratio < lo ? lo : (ratio > hi ? hi : ratio);
  const S unclipped_term = ratio * adv;
  const bool unclipped = unclipped_term <= clipped_ratio * adv;
  const S pg = unclipped ? -unclipped_term : -(clipped_ratio * adv);
  const bool cut = (ratio < lo && adv < S(0)) || (ratio > hi && adv > S(0));

  const S err = value - target;
  S v_err = err * err, d_value = S(2) * err;
  if (c.value_clipped) {
    const S vc = S(c.value_clip);
    const S delta = value - old_value;
    const S clamped = delta < -vc ? -vc : (delta > vc ? vc : delta);
    const S clipped_err = old_value + clamped - target;
    if (clipped_err * clipped_err > v_err) {
      v_err = clipped_err * clipped_err;
      d_value = (delta >= -vc && delta <= vc) ? S(2) * clipped_err : S(0);
    }
  }
  *grad_value = S(c.vf_coef) * S(0.5) * d_value * inv_m;
  sums.pg += pg;
  sums.v_err += v_err;
  sums.entropy += entropy;
  sums.kl += (ratio - S(1)) - log_ratio;
  sums.clipped += cut ? 1.0 : 0.0;
  return (unclipped ? -unclipped_term : S(0)) * inv_m;
}

// One sample of a categorical policy, its softmax already in grad_logits (with lse and entropy,
// from ppo_softmax): its terms (ppo_terms), and the logits' derivatives in place of the softmax.
template <typename S>
NOSTALL_HD inline void ppo_sample_terms(const S* logits, int64_t A, int64_t action, S lse,
                                        S entropy, S value, S old_lp, S old_value, S advantage,
                                        S target, S adv_shift, S adv_scale, const PpoLossConfig& c,
                                        S inv_m, S* grad_logits, S* grad_value, PpoSums& sums) {
  const bool valid = action >= 0 && action < A;
  const S nan = S(NAN);
  const S new_lp = valid ? logits[action] - lse : nan;
  const S d_lp = ppo_terms(new_lp, entropy, value, old_lp, old_value, advantage, target, adv_shift,
                           adv_scale, c, inv_m, grad_value, sums);
  const S ent_scale = S(c.ent_coef) * inv_m;
  for (int64_t a = 0; a < A; ++a) {
    const S p = grad_logits[a];
    const S onehot = a == action ? S(1) : S(0);
    grad_logits[a] =
        valid ? d_lp * (onehot - p) + ent_scale * p * ((logits[a] - lse) + entropy) : nan;
  }
}

template <typename S>
NOSTALL_HD inline void ppo_sample(const S* logits, int64_t A, int64_t action, S value, S old_lp,
                                  S old_value, S advantage, S target, S adv_shift, S adv_scale,
                                  const PpoLossConfig& c, S inv_m, S* grad_logits, S* grad_value,
                                  PpoSums& sums) {
  S lse, entropy;
  ppo_softmax(logits, A, grad_logits, &lse, &entropy);
  ppo_sample_terms(logits, A, action, lse, entropy, value, old_lp, old_value, advantage, target,
                   adv_shift, adv_scale, c, inv_m, grad_logits, grad_value, sums);
}

// loss and stats [5] from the sums over M samples.
template <typename S>
NOSTALL_HD inline void ppo_finish(const PpoSums& s, int64_t M, const PpoLossConfig& c, S* loss,
                                  S* stats) {
  const double inv_m = 1.0 / static_cast<double>(M);
  const double pg = s.pg * inv_m, v = 0.5 * s.v_err * inv_m, h = s.entropy * inv_m;
  *loss = static_cast<S>(pg - c.ent_coef * h + c.vf_coef * v);
  stats[0] = static_cast<S>(pg);
  stats[1] = static_cast<S>(v);
  stats[2] = static_cast<S>(h);
  stats[3] = static_cast<S>(s.kl * inv_m);
  stats[4] = static_cast<S>(s.clipped * inv_m);
}

// (adv_shift, adv_scale) of the normalisation from the advantages' sum and sum of squared
// deviations from the mean (0, 1 when off).
template <typename S>
NOSTALL_HD inline void advantage_normaliser(double mean, double squared_deviations, int64_t M,
                                            S* shift, S* scale) {
  using std::sqrt;
  const double std_dev = sqrt(squared_deviations / static_cast<double>(M - 1));
  *shift = static_cast<S>(mean);
  *scale = static_cast<S>(1.0 / (std_dev + 1e-8));
}

// (loss, stats, grad_logits, grad_value).
using PpoLossOutput = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// Both losses' outputs, like `like`: the loss, stats [5], the policy input's derivative of
// `policy_grad_sizes` ([M, A] logits or [M] log_prob) and the value's [M], contiguous.
inline PpoLossOutput new_ppo_outputs(const Tensor& like,
                                     std::initializer_list<int64_t> policy_grad_sizes, int64_t M) {
  return {torch::stable::new_empty(like, {}), new_contiguous(like, {5}),
          new_contiguous(like, policy_grad_sizes), new_contiguous(like, {M})};
}

PpoLossOutput ppo_loss_cpu(Tensor logits, Tensor action, Tensor value, Tensor old_log_prob,
                           Tensor old_value, Tensor advantage, Tensor value_target,
                           double clip_coef, std::optional<double> value_clip, double ent_coef,
                           double vf_coef, bool normalize_advantage);
std::tuple<Tensor, Tensor> ppo_loss_backward_cpu(Tensor grad_loss, Tensor grad_logits,
                                                 Tensor grad_value);

PpoLossOutput ppo_loss_cuda(Tensor logits, Tensor action, Tensor value, Tensor old_log_prob,
                            Tensor old_value, Tensor advantage, Tensor value_target,
                            double clip_coef, std::optional<double> value_clip, double ent_coef,
                            double vf_coef, bool normalize_advantage);
std::tuple<Tensor, Tensor> ppo_loss_backward_cuda(Tensor grad_loss, Tensor grad_logits,
                                                  Tensor grad_value);

PpoLossOutput ppo_loss_from_log_prob_cpu(Tensor log_prob, Tensor entropy, Tensor value,
                                         Tensor old_log_prob, Tensor old_value, Tensor advantage,
                                         Tensor value_target, double clip_coef,
                                         std::optional<double> value_clip, double ent_coef,
                                         double vf_coef, bool normalize_advantage);
PpoLossOutput ppo_loss_from_log_prob_cuda(Tensor log_prob, Tensor entropy, Tensor value,
                                          Tensor old_log_prob, Tensor old_value, Tensor advantage,
                                          Tensor value_target, double clip_coef,
                                          std::optional<double> value_clip, double ent_coef,
                                          double vf_coef, bool normalize_advantage);
// (grad_log_prob, grad_entropy, grad_value): the saved derivatives scaled by grad_loss, and
// d loss / d entropy = -ent_coef / M.
using PpoLogProbGrads = std::tuple<Tensor, Tensor, Tensor>;
PpoLogProbGrads ppo_loss_from_log_prob_backward_cpu(Tensor grad_loss, Tensor grad_log_prob,
                                                    Tensor grad_value, double ent_coef);
PpoLogProbGrads ppo_loss_from_log_prob_backward_cuda(Tensor grad_loss, Tensor grad_log_prob,
                                                     Tensor grad_value, double ent_coef);

inline void check_ppo_log_prob_backward_args(const Tensor& grad_loss, const Tensor& grad_log_prob,
                                             const Tensor& grad_value) {
  STD_TORCH_CHECK(grad_log_prob.dim() == 1 && is_floating(grad_log_prob),
                  "grad_log_prob must be a float32 or float64 [M] tensor");
  STD_TORCH_CHECK(grad_value.dim() == 1 && grad_value.size(0) == grad_log_prob.size(0) &&
                      grad_value.scalar_type() == grad_log_prob.scalar_type(),
                  "grad_value must be [M] = [", grad_log_prob.size(0),
                  "] with the dtype of grad_log_prob");
  STD_TORCH_CHECK(grad_loss.dim() == 0 && grad_loss.scalar_type() == grad_log_prob.scalar_type(),
                  "grad_loss must be a scalar tensor with the dtype of grad_log_prob");
  STD_TORCH_CHECK(
      grad_loss.device() == grad_log_prob.device() && grad_value.device() == grad_log_prob.device(),
      "grad_loss, grad_log_prob and grad_value must be on one device");
}

inline void check_ppo_loss_backward_args(const Tensor& grad_loss, const Tensor& grad_logits,
                                         const Tensor& grad_value) {
  STD_TORCH_CHECK(grad_logits.dim() == 2 && is_floating(grad_logits),
                  "grad_logits must be a float32 or float64 [M, A] tensor");
  STD_TORCH_CHECK(grad_value.dim() == 1 && grad_value.size(0) == grad_logits.size(0) &&
                      grad_value.scalar_type() == grad_logits.scalar_type(),
                  "grad_value must be [M] = [", grad_logits.size(0),
                  "] with the dtype of grad_logits");
  STD_TORCH_CHECK(grad_loss.dim() == 0 && grad_loss.scalar_type() == grad_logits.scalar_type(),
                  "grad_loss must be a scalar tensor with the dtype of grad_logits");
  STD_TORCH_CHECK(
      grad_loss.device() == grad_logits.device() && grad_value.device() == grad_logits.device(),
      "grad_loss, grad_logits and grad_value must be on one device");
}

}  // namespace nostall
