// CPU kernels for clipped_policy_loss and its adjoint. Rows (sequences) run in parallel, each
// writing its own sums to a table that one thread then combines in order: the result does not
// depend on the thread count.
#include "ops/policy_loss.h"

#include <torch/csrc/stable/ops.h>

#include <type_traits>
#include <vector>

#include "common/tensor_utils.h"
#include "ops/cpu_rows.h"

namespace nostall {

namespace {

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

  // Calls f(i, unmasked, terms) for every token i of row b, masked ones included (their terms
  // may be NaN: callers select them away, never multiply). The float64 path; float32 rows run
  // through the vectorised row kernel instead (cpu_rows.h).
  template <typename F>
  void visit_row(const ClipConfig& cfg, int64_t b, const F& f) const {
    const double* lp = log_prob.const_data_ptr<double>();
    const double* old = old_log_prob.const_data_ptr<double>();
    const double* adv = advantage.const_data_ptr<double>();
    const bool* m = mask.const_data_ptr<bool>();
    const double* beh = behavior.has_value() ? behavior->const_data_ptr<double>() : nullptr;
    for (int64_t i = b * T; i < (b + 1) * T; ++i) {
      const double w = beh ? truncated_is_weight(old[i], beh[i], cfg) : 1.0;
      f(i, m[i], clipped_token(lp[i], old[i], adv[adv_stride ? i : b], w, cfg));
    }
  }

  rows::PolicyRow float_row(const ClipConfig& cfg, int64_t b) const {
    const int64_t i = b * T;
    const float* adv = advantage.const_data_ptr<float>();
    return {log_prob.const_data_ptr<float>() + i,
            old_log_prob.const_data_ptr<float>() + i,
            behavior.has_value() ? behavior->const_data_ptr<float>() + i : nullptr,
            adv_stride ? adv + i : nullptr,
            adv_stride ? 0.0f : adv[b],
            reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>()) + i,
            T,
            static_cast<float>(cfg.lo),
            static_cast<float>(cfg.hi),
            cfg.dual ? static_cast<float>(cfg.dual_clip) : 0.0f,
            static_cast<float>(cfg.is_cap)};
  }

  // Row b's sums {loss, tokens, clipped, kl}; with `grad`, also its gradient row.
  template <typename S>
  void row(const ClipConfig& cfg, int64_t b, double* sums, S* grad, S grad_scale) const {
    if constexpr (std::is_same_v<S, float>) {
      float s[kRowSums];
      rows::kernels().policy_row_f32(float_row(cfg, b), s, grad ? grad + b * T : nullptr,
                                     grad_scale);
      for (int k = 0; k < kRowSums; ++k) sums[k] = s[k];
    } else {
      double loss = 0, tokens = 0, clipped = 0, kl = 0;
      visit_row(cfg, b, [&](int64_t i, bool on, const TokenTerms<double>& k) {
        loss += on ? k.loss : 0.0;
        tokens += on ? 1.0 : 0.0;
        clipped += (on && k.clipped) ? 1.0 : 0.0;
        kl += on ? k.kl : 0.0;
        if (grad) grad[i] = on ? grad_scale * k.dloss : 0.0;
      });
      sums[0] = loss;
      sums[1] = tokens;
      sums[2] = clipped;
      sums[3] = kl;
    }
  }

  // Rows per parallel task: about 8k tokens each.
  int64_t row_grain() const { return std::max<int64_t>(1, 8192 / T); }

  // The [B, kRowSums] table of per-sequence sums (rows combine in float64), and every token's
  // derivative into token_grad.
  template <typename S>
  std::vector<double> row_sums(const ClipConfig& cfg, S* token_grad) const {
    std::vector<double> sums(B * kRowSums, 0.0);
    torch::stable::parallel_for(0, B, row_grain(), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        row<S>(cfg, b, sums.data() + b * kRowSums, token_grad, S(1));
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

std::tuple<Tensor, Tensor, Tensor, Tensor> clipped_policy_loss_cpu(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap) {
  const ClipConfig cfg =
      checked_clip_config(log_prob, old_log_prob, advantage, mask, behavior_log_prob, clip_low,
                          clip_high, dual_clip, is_cap, aggregation, max_tokens);
  const LossInputs in(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  LossOutputs out(log_prob);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const std::vector<double> sums = in.row_sums<S>(cfg, out_ptr<S>(out.token_grad));
    const double total = in.total_tokens(sums);
    double l = 0, clipped = 0, kl = 0;
    for (int64_t b = 0; b < in.B; ++b) {
      const double* row = sums.data() + b * kRowSums;
      l += row[0] * sequence_weight(cfg, in.B, row[1], total);
      clipped += row[2];
      kl += row[3];
    }
    const double per_token = 1.0 / (total > 1.0 ? total : 1.0);
    *out_ptr<S>(out.loss) = static_cast<S>(l);
    *out_ptr<S>(out.clip_fraction) = static_cast<S>(clipped * per_token);
    *out_ptr<S>(out.approx_kl) = static_cast<S>(kl * per_token);
  });
  return out.tuple();
}

Tensor clipped_policy_loss_backward_cpu(Tensor grad_loss, Tensor token_grad, Tensor mask,
                                        std::string aggregation, int64_t max_tokens) {
  check_policy_loss_backward_args(grad_loss, token_grad, mask, aggregation, max_tokens);
  const ClipConfig cfg = aggregation_config(aggregation, max_tokens);
  token_grad = as_contiguous(token_grad);
  mask = as_contiguous(mask);
  const int64_t B = token_grad.size(0);
  const int64_t T = token_grad.size(1);
  Tensor grad_log_prob = torch::stable::empty_like(token_grad);
  // Token counts per row, for the normalisers (a byte sum per row: vectorised).
  std::vector<double> tokens(B, 0.0);
  const uint8_t* m = reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t count = 0;
    for (int64_t t = 0; t < T; ++t) count += m[b * T + t];
    tokens[b] = static_cast<double>(count);
    total += tokens[b];
  }
  dispatch_floating(token_grad.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S g = *grad_loss.const_data_ptr<S>();
    const S* in = token_grad.const_data_ptr<S>();
    S* out = out_ptr<S>(grad_log_prob);
    torch::stable::parallel_for(0, B, std::max<int64_t>(1, 32768 / T), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const S scale = g * static_cast<S>(sequence_weight(cfg, B, tokens[b], total));
        for (int64_t i = b * T; i < (b + 1) * T; ++i) out[i] = scale * in[i];
      }
    });
  });
  return grad_log_prob;
}

}  // namespace nostall
