// CPU kernels of ppo_loss (see ppo_loss.h). One thread, samples in order: a PPO minibatch is a
// few hundred to a few thousand rows of a handful of actions, microseconds of work, and a fixed
// summation order keeps the loss reproducible whatever the thread count.
#include "ops/ppo_loss.h"

#include <torch/csrc/stable/ops.h>

#include "common/tensor_utils.h"

namespace nostall {

namespace {

// The value and the targets of every sample (any strides).
template <typename S>
struct SampleRows {
  const S *value, *old_log_prob, *old_value, *advantage, *value_target;
  int64_t vs, olps, ovs, advs, tgts;

  SampleRows(const Tensor& v, const Tensor& olp, const Tensor& ov, const Tensor& adv,
             const Tensor& tgt)
      : value(v.const_data_ptr<S>()),
        old_log_prob(olp.const_data_ptr<S>()),
        old_value(ov.const_data_ptr<S>()),
        advantage(adv.const_data_ptr<S>()),
        value_target(tgt.const_data_ptr<S>()),
        vs(v.stride(0)),
        olps(olp.stride(0)),
        ovs(ov.stride(0)),
        advs(adv.stride(0)),
        tgts(tgt.stride(0)) {}
};

// Both losses over M samples in order: the advantage normaliser, then row(m, shift, scale,
// inv_m, sums) for each sample (its derivatives, its terms into sums), then loss and stats.
template <typename S, typename Row>
void ppo_rows(const PpoLossConfig& c, int64_t M, const SampleRows<S>& in, Tensor& loss,
              Tensor& stats, Row&& row) {
  S shift = S(0), scale = S(1);
  if (c.normalize) {
    double sum = 0;
    for (int64_t m = 0; m < M; ++m) sum += in.advantage[m * in.advs];
    const double mean = sum / static_cast<double>(M);
    double dev = 0;
    for (int64_t m = 0; m < M; ++m) {
      const double d = in.advantage[m * in.advs] - mean;
      dev += d * d;
    }
    advantage_normaliser(mean, dev, M, &shift, &scale);
  }
  const S inv_m = S(1) / static_cast<S>(M);
  PpoSums sums;
  for (int64_t m = 0; m < M; ++m) row(m, shift, scale, inv_m, sums);
  ppo_finish<S>(sums, M, c, loss.mutable_data_ptr<S>(), stats.mutable_data_ptr<S>());
}

}  // namespace

PpoLossOutput ppo_loss_cpu(Tensor logits, Tensor action, Tensor value, Tensor old_log_prob,
                           Tensor old_value, Tensor advantage, Tensor value_target,
                           double clip_coef, std::optional<double> value_clip, double ent_coef,
                           double vf_coef, bool normalize_advantage) {
  const PpoLossConfig c = checked_ppo_loss_config(logits, action, value, old_log_prob, old_value,
                                                  advantage, value_target, clip_coef, value_clip,
                                                  ent_coef, vf_coef, normalize_advantage);
  const int64_t M = logits.size(0), A = logits.size(1);
  const int64_t* act = action.const_data_ptr<int64_t>();
  const int64_t as = action.stride(0);
  for (int64_t m = 0; m < M; ++m) {
    STD_TORCH_CHECK(act[m * as] >= 0 && act[m * as] < A, "action must lie in [0, A = ", A,
                    "), got action[", m, "] = ", act[m * as]);
  }
  logits = as_contiguous(logits);
  PpoLossOutput out = new_ppo_outputs(logits, {M, A}, M);
  Tensor &loss = std::get<0>(out), &stats = std::get<1>(out), &grad_logits = std::get<2>(out),
         &grad_value = std::get<3>(out);
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const SampleRows<S> in(value, old_log_prob, old_value, advantage, value_target);
    const S* x = logits.const_data_ptr<S>();
    S* gl = grad_logits.mutable_data_ptr<S>();
    S* gv = grad_value.mutable_data_ptr<S>();
    ppo_rows<S>(c, M, in, loss, stats, [&](int64_t m, S shift, S scale, S inv_m, PpoSums& sums) {
      ppo_sample<S>(x + m * A, A, act[m * as], in.value[m * in.vs], in.old_log_prob[m * in.olps],
                    in.old_value[m * in.ovs], in.advantage[m * in.advs],
                    in.value_target[m * in.tgts], shift, scale, c, inv_m, gl + m * A, gv + m, sums);
    });
  });
  return out;
}

PpoLossOutput ppo_loss_from_log_prob_cpu(Tensor log_prob, Tensor entropy, Tensor value,
                                         Tensor old_log_prob, Tensor old_value, Tensor advantage,
                                         Tensor value_target, double clip_coef,
                                         std::optional<double> value_clip, double ent_coef,
                                         double vf_coef, bool normalize_advantage) {
  const PpoLossConfig c = checked_ppo_log_prob_config(
      log_prob, entropy, value, old_log_prob, old_value, advantage, value_target, clip_coef,
      value_clip, ent_coef, vf_coef, normalize_advantage);
  const int64_t M = log_prob.size(0);
  PpoLossOutput out = new_ppo_outputs(log_prob, {M}, M);
  Tensor &loss = std::get<0>(out), &stats = std::get<1>(out), &grad_log_prob = std::get<2>(out),
         &grad_value = std::get<3>(out);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const SampleRows<S> in(value, old_log_prob, old_value, advantage, value_target);
    const S *lp = log_prob.const_data_ptr<S>(), *h = entropy.const_data_ptr<S>();
    const int64_t lps = log_prob.stride(0), hs = entropy.stride(0);
    S* glp = grad_log_prob.mutable_data_ptr<S>();
    S* gv = grad_value.mutable_data_ptr<S>();
    ppo_rows<S>(c, M, in, loss, stats, [&](int64_t m, S shift, S scale, S inv_m, PpoSums& sums) {
      glp[m] =
          ppo_terms<S>(lp[m * lps], h[m * hs], in.value[m * in.vs], in.old_log_prob[m * in.olps],
                       in.old_value[m * in.ovs], in.advantage[m * in.advs],
                       in.value_target[m * in.tgts], shift, scale, c, inv_m, gv + m, sums);
    });
  });
  return out;
}

PpoLogProbGrads ppo_loss_from_log_prob_backward_cpu(Tensor grad_loss, Tensor grad_log_prob,
                                                    Tensor grad_value, double ent_coef) {
  check_ppo_log_prob_backward_args(grad_loss, grad_log_prob, grad_value);
  const int64_t M = grad_log_prob.size(0);
  Tensor out_log_prob = new_contiguous(grad_log_prob, {M});
  Tensor out_entropy = new_contiguous(grad_log_prob, {M});
  Tensor out_value = new_contiguous(grad_log_prob, {M});
  dispatch_floating(grad_log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S g = *grad_loss.const_data_ptr<S>();
    const S d_entropy = g * static_cast<S>(-ent_coef / static_cast<double>(M));
    const S* a = grad_log_prob.const_data_ptr<S>();
    const S* b = grad_value.const_data_ptr<S>();
    const int64_t as = grad_log_prob.stride(0), bs = grad_value.stride(0);
    S* oa = out_log_prob.mutable_data_ptr<S>();
    S* oh = out_entropy.mutable_data_ptr<S>();
    S* ob = out_value.mutable_data_ptr<S>();
    for (int64_t m = 0; m < M; ++m) {
      oa[m] = g * a[m * as];
      oh[m] = d_entropy;
      ob[m] = g * b[m * bs];
    }
  });
  return {out_log_prob, out_entropy, out_value};
}

std::tuple<Tensor, Tensor> ppo_loss_backward_cpu(Tensor grad_loss, Tensor grad_logits,
                                                 Tensor grad_value) {
  check_ppo_loss_backward_args(grad_loss, grad_logits, grad_value);
  grad_logits = as_contiguous(grad_logits);
  grad_value = as_contiguous(grad_value);
  Tensor out_logits = new_contiguous(grad_logits, {grad_logits.size(0), grad_logits.size(1)});
  Tensor out_value = new_contiguous(grad_value, {grad_value.size(0)});
  dispatch_floating(grad_logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S g = *grad_loss.const_data_ptr<S>();
    const S* a = grad_logits.const_data_ptr<S>();
    const S* b = grad_value.const_data_ptr<S>();
    S* oa = out_logits.mutable_data_ptr<S>();
    S* ob = out_value.mutable_data_ptr<S>();
    for (int64_t i = 0; i < grad_logits.numel(); ++i) oa[i] = g * a[i];
    for (int64_t i = 0; i < grad_value.numel(); ++i) ob[i] = g * b[i];
  });
  return {out_logits, out_value};
}

}  // namespace nostall
