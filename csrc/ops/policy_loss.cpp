// CPU kernels for clipped_policy_loss and its adjoint. Rows (sequences) run in parallel, each
// writing its own sums to a table that one thread then combines in order: the result does not
// depend on the thread count.
#include "ops/policy_loss.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

#include "common/tensor_utils.h"

namespace nostall {

namespace {

using torch::stable::empty_like;

// Contiguous views of the loss inputs; the advantage has one value per row or per token.
struct LossInputs {
  Tensor log_prob, old_log_prob, advantage, mask;
  std::optional<Tensor> behavior;
  int64_t B, T, adv_stride;  // adv_stride: 0 for one advantage per sequence

  LossInputs(const Tensor& lp, const Tensor& old_lp, const Tensor& adv, const Tensor& m,
             const std::optional<Tensor>& beh)
      : log_prob(as_contiguous(lp)),
        old_log_prob(as_contiguous(old_lp)),
        advantage(as_contiguous(adv)),
        mask(as_contiguous(m)),
        B(lp.size(0)),
        T(lp.size(1)),
        adv_stride(adv.dim() == 2 ? 1 : 0) {
    if (beh.has_value()) behavior = as_contiguous(*beh);
  }

  // Calls f(b, t, terms) for every unmasked token of rows [b0, b1).
  template <typename S, typename F>
  void for_tokens(const ClipConfig& cfg, int64_t b0, int64_t b1, const F& f) const {
    const S* lp = log_prob.const_data_ptr<S>();
    const S* old = old_log_prob.const_data_ptr<S>();
    const S* adv = advantage.const_data_ptr<S>();
    const bool* m = mask.const_data_ptr<bool>();
    const S* beh = behavior.has_value() ? behavior->const_data_ptr<S>() : nullptr;
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = b * T + t;
        if (!m[i]) continue;
        const S w = beh ? truncated_is_weight(old[i], beh[i], cfg) : S(1);
        const S a = adv[adv_stride ? i : b];
        f(b, i, clipped_token(lp[i], old[i], a, w, cfg));
      }
    }
  }

  // The [B, kRowSums] table of per-sequence sums.
  template <typename S>
  std::vector<double> row_sums(const ClipConfig& cfg) const {
    std::vector<double> sums(B * kRowSums, 0.0);
    torch::stable::parallel_for(0, B, std::max<int64_t>(1, 4096 / T), [&](int64_t b0, int64_t b1) {
      for_tokens<S>(cfg, b0, b1, [&](int64_t b, int64_t, const TokenTerms<S>& k) {
        double* row = sums.data() + b * kRowSums;
        row[0] += k.loss;
        row[1] += 1;
        row[2] += k.clipped;
        row[3] += k.kl;
      });
    });
    return sums;
  }

  double total_tokens(const std::vector<double>& sums) const {
    double total = 0;
    for (int64_t b = 0; b < B; ++b) total += sums[b * kRowSums + 1];
    return total;
  }
};

}  // namespace

std::tuple<Tensor, Tensor, Tensor> clipped_policy_loss_cpu(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap) {
  check_policy_loss_args(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  const ClipConfig cfg = clip_config(clip_low, clip_high, dual_clip, behavior_log_prob.has_value(),
                                     is_cap, aggregation, max_tokens);
  const LossInputs in(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  Tensor loss = torch::stable::new_empty(log_prob, {});
  Tensor clip_fraction = torch::stable::new_empty(log_prob, {});
  Tensor approx_kl = torch::stable::new_empty(log_prob, {});
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const std::vector<double> sums = in.row_sums<S>(cfg);
    const double total = in.total_tokens(sums);
    double l = 0, clipped = 0, kl = 0;
    for (int64_t b = 0; b < in.B; ++b) {
      const double* row = sums.data() + b * kRowSums;
      l += row[0] * sequence_weight(cfg, in.B, row[1], total);
      clipped += row[2];
      kl += row[3];
    }
    const double per_token = 1.0 / (total > 1.0 ? total : 1.0);
    *out_ptr<S>(loss) = static_cast<S>(l);
    *out_ptr<S>(clip_fraction) = static_cast<S>(clipped * per_token);
    *out_ptr<S>(approx_kl) = static_cast<S>(kl * per_token);
  });
  return {loss, clip_fraction, approx_kl};
}

Tensor clipped_policy_loss_backward_cpu(Tensor grad_loss, Tensor log_prob, Tensor old_log_prob,
                                        Tensor advantage, Tensor mask, double clip_low,
                                        double clip_high, std::string aggregation,
                                        int64_t max_tokens, std::optional<double> dual_clip,
                                        std::optional<Tensor> behavior_log_prob, double is_cap) {
  check_policy_loss_args(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  STD_TORCH_CHECK(grad_loss.dim() == 0 && grad_loss.scalar_type() == log_prob.scalar_type(),
                  "grad_loss must be a scalar tensor with the dtype of log_prob");
  STD_TORCH_CHECK(grad_loss.device() == log_prob.device(),
                  "grad_loss must be on the device of log_prob");
  const ClipConfig cfg = clip_config(clip_low, clip_high, dual_clip, behavior_log_prob.has_value(),
                                     is_cap, aggregation, max_tokens);
  const LossInputs in(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  Tensor grad_log_prob = torch::stable::new_zeros(log_prob, {in.B, in.T});
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    // Token counts per row, for the normalisers.
    std::vector<double> tokens(in.B, 0.0);
    const bool* m = in.mask.const_data_ptr<bool>();
    double total = 0;
    for (int64_t b = 0; b < in.B; ++b) {
      for (int64_t t = 0; t < in.T; ++t) tokens[b] += m[b * in.T + t];
      total += tokens[b];
    }
    const S g = *grad_loss.const_data_ptr<S>();
    S* out = out_ptr<S>(grad_log_prob);
    torch::stable::parallel_for(
        0, in.B, std::max<int64_t>(1, 4096 / in.T), [&](int64_t b0, int64_t b1) {
          in.for_tokens<S>(cfg, b0, b1, [&](int64_t b, int64_t i, const TokenTerms<S>& k) {
            out[i] = g * k.dloss * static_cast<S>(sequence_weight(cfg, in.B, tokens[b], total));
          });
        });
  });
  return grad_log_prob;
}

}  // namespace nostall
