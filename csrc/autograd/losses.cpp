// Autograd kernels of the policy-gradient ops. Each backward is a native backward op; outputs
// that are statistics (logsumexp, clip fraction, approximate KL) are marked non-differentiable,
// and gradients flow only to the arguments the formulas differentiate (reward; logits or hidden
// and weight; log_prob), the rest being targets. Grads are not materialised: an output nobody
// differentiates costs no zero tensor, and a backward with no incoming gradient does nothing.
#include <optional>
#include <string>

#include "autograd/native.h"

namespace nostall::autograd {
namespace {

using OptTensor = std::optional<Tensor>;
using OptDouble = std::optional<double>;

// group_advantages(reward, group_index, num_groups, scale, eps)
struct GroupAdvantagesFunction : torch::autograd::Function<GroupAdvantagesFunction> {
  using Sig = Tensor(const Tensor&, const Tensor&, int64_t, c10::string_view, double);
  using BackwardSig = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, c10::string_view,
                             double);

  static Tensor forward(AutogradContext* ctx, const Tensor& reward, const Tensor& group_index,
                        int64_t num_groups, const std::string& scale, double eps) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);  // no zero tensors made for unused outputs
    static const auto op = native<Sig>("nostall::group_advantages");
    ctx->save_for_backward({reward, group_index});
    ctx->saved_data["num_groups"] = num_groups;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["eps"] = eps;
    return op.call(reward, group_index, num_groups, scale, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(5);
    static const auto op = native<BackwardSig>("nostall::group_advantages_backward");
    const variable_list saved = ctx->get_saved_variables();
    const Tensor grad =
        op.call(grads[0], saved[0], saved[1], ctx->saved_data["num_groups"].toInt(),
                ctx->saved_data["scale"].toStringRef(), ctx->saved_data["eps"].toDouble());
    return {grad, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// token_log_prob(logits, tokens) -> (log_prob, logsumexp)
struct TokenLogProbFunction : torch::autograd::Function<TokenLogProbFunction> {
  using Sig = Pair(const Tensor&, const Tensor&);
  using BackwardSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&);

  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& tokens) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);  // no zero tensors made for unused outputs
    static const auto op = native<Sig>("nostall::token_log_prob");
    auto [log_prob, logsumexp] = op.call(logits, tokens);
    ctx->save_for_backward({logits, tokens, logsumexp});
    ctx->mark_non_differentiable({logsumexp});
    return {log_prob, logsumexp};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(2);
    static const auto op = native<BackwardSig>("nostall::token_log_prob_backward");
    const variable_list s = ctx->get_saved_variables();
    return {op.call(grads[0], s[0], s[1], s[2]), Tensor()};
  }
};

// token_log_prob_linear(hidden, weight, tokens, chunk_size) -> (log_prob, logsumexp)
struct TokenLogProbLinearFunction : torch::autograd::Function<TokenLogProbLinearFunction> {
  using Sig = Pair(const Tensor&, const Tensor&, const Tensor&, int64_t);
  using BackwardSig = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, int64_t);

  static variable_list forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                               const Tensor& tokens, int64_t chunk_size) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);  // no zero tensors made for unused outputs
    static const auto op = native<Sig>("nostall::token_log_prob_linear");
    auto [log_prob, logsumexp] = op.call(hidden, weight, tokens, chunk_size);
    ctx->save_for_backward({hidden, weight, tokens, logsumexp});
    ctx->saved_data["chunk_size"] = chunk_size;
    ctx->mark_non_differentiable({logsumexp});
    return {log_prob, logsumexp};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(4);
    static const auto op = native<BackwardSig>("nostall::token_log_prob_linear_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [grad_hidden, grad_weight] =
        op.call(grads[0], s[0], s[1], s[2], s[3], ctx->saved_data["chunk_size"].toInt());
    return {grad_hidden, grad_weight, Tensor(), Tensor()};
  }
};

// token_entropy_linear(hidden, weight, chunk_size) -> (entropy, logsumexp)
struct TokenEntropyLinearFunction : torch::autograd::Function<TokenEntropyLinearFunction> {
  using Sig = Pair(const Tensor&, const Tensor&, int64_t);
  using BackwardSig = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, int64_t);

  static variable_list forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                               int64_t chunk_size) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);  // no zero tensors made for unused outputs
    static const auto op = native<Sig>("nostall::token_entropy_linear");
    auto [entropy, logsumexp] = op.call(hidden, weight, chunk_size);
    ctx->save_for_backward({hidden, weight, entropy, logsumexp});
    ctx->saved_data["chunk_size"] = chunk_size;
    ctx->mark_non_differentiable({logsumexp});
    return {entropy, logsumexp};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(3);
    static const auto op = native<BackwardSig>("nostall::token_entropy_linear_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [grad_hidden, grad_weight] =
        op.call(grads[0], s[0], s[1], s[2], s[3], ctx->saved_data["chunk_size"].toInt());
    return {grad_hidden, grad_weight, Tensor()};
  }
};

// clipped_policy_loss(log_prob, old_log_prob, advantage, mask, clip_low, clip_high, aggregation,
// max_tokens, dual_clip, behavior_log_prob, is_cap) -> (loss, clip_fraction, approx_kl,
// token_grad). The forward computes each token's derivative anyway: the backward only scales it.
struct PolicyLossFunction : torch::autograd::Function<PolicyLossFunction> {
  using Sig = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                         const Tensor&, const Tensor&, double,
                                                         double, c10::string_view, int64_t,
                                                         OptDouble, const OptTensor&, double);
  using BackwardSig = Tensor(const Tensor&, const Tensor&, const Tensor&, c10::string_view,
                             int64_t);

  static variable_list forward(AutogradContext* ctx, const Tensor& log_prob,
                               const Tensor& old_log_prob, const Tensor& advantage,
                               const Tensor& mask, double clip_low, double clip_high,
                               const std::string& aggregation, int64_t max_tokens,
                               OptDouble dual_clip, const OptTensor& behavior_log_prob,
                               double is_cap) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);  // no zero tensors made for unused outputs
    static const auto op = native<Sig>("nostall::clipped_policy_loss");
    auto [loss, clip_fraction, approx_kl, token_grad] =
        op.call(log_prob, old_log_prob, advantage, mask, clip_low, clip_high, aggregation,
                max_tokens, dual_clip, behavior_log_prob, is_cap);
    ctx->save_for_backward({token_grad, mask});
    ctx->saved_data["aggregation"] = aggregation;
    ctx->saved_data["max_tokens"] = max_tokens;
    ctx->mark_non_differentiable({clip_fraction, approx_kl, token_grad});
    return {loss, clip_fraction, approx_kl, token_grad};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(11);
    // As for ppo_loss: token_grad is a constant to autograd, so no graph of this backward.
    reject_double_backward("clipped_policy_loss", at::GradMode::is_enabled());
    static const auto op = native<BackwardSig>("nostall::clipped_policy_loss_backward");
    const variable_list s = ctx->get_saved_variables();
    variable_list out(11);
    out[0] = op.call(grads[0], s[0], s[1], ctx->saved_data["aggregation"].toStringRef(),
                     ctx->saved_data["max_tokens"].toInt());
    return out;
  }
};

// ppo_loss(logits, action, value, old_log_prob, old_value, advantage, value_target, clip_coef,
// value_clip, ent_coef, vf_coef, normalize_advantage) -> (loss, stats, grad_logits, grad_value).
// The forward computes the derivatives anyway: the backward only scales them.
struct PpoLossFunction : torch::autograd::Function<PpoLossFunction> {
  using Sig = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                         const Tensor&, const Tensor&,
                                                         const Tensor&, const Tensor&,
                                                         const Tensor&, double, OptDouble, double,
                                                         double, bool);
  using BackwardSig = Pair(const Tensor&, const Tensor&, const Tensor&);

  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& action,
                               const Tensor& value, const Tensor& old_log_prob,
                               const Tensor& old_value, const Tensor& advantage,
                               const Tensor& value_target, double clip_coef, OptDouble value_clip,
                               double ent_coef, double vf_coef, bool normalize_advantage) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);
    static const auto op = native<Sig>("nostall::ppo_loss");
    auto [loss, stats, grad_logits, grad_value] =
        op.call(logits, action, value, old_log_prob, old_value, advantage, value_target, clip_coef,
                value_clip, ent_coef, vf_coef, normalize_advantage);
    ctx->save_for_backward({grad_logits, grad_value});
    ctx->mark_non_differentiable({stats, grad_logits, grad_value});
    return {loss, stats, grad_logits, grad_value};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(12);
    // The saved derivatives are constants to autograd: a graph of this backward (create_graph)
    // would silently give a zero second derivative, so it is refused.
    reject_double_backward("ppo_loss", at::GradMode::is_enabled());
    static const auto op = native<BackwardSig>("nostall::ppo_loss_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [grad_logits, grad_value] = op.call(grads[0], s[0], s[1]);
    variable_list out(12);
    out[0] = grad_logits;
    out[2] = grad_value;
    return out;
  }
};

// ppo_loss_from_log_prob(log_prob, entropy, value, old_log_prob, old_value, advantage,
// value_target, clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage) -> (loss, stats,
// grad_log_prob, grad_value): as ppo_loss, differentiable in log_prob, entropy and value.
struct PpoLogProbLossFunction : torch::autograd::Function<PpoLogProbLossFunction> {
  using Sig = PpoLossFunction::Sig;
  using BackwardSig = Triple(const Tensor&, const Tensor&, const Tensor&, double);

  static variable_list forward(AutogradContext* ctx, const Tensor& log_prob, const Tensor& entropy,
                               const Tensor& value, const Tensor& old_log_prob,
                               const Tensor& old_value, const Tensor& advantage,
                               const Tensor& value_target, double clip_coef, OptDouble value_clip,
                               double ent_coef, double vf_coef, bool normalize_advantage) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);
    static const auto op = native<Sig>("nostall::ppo_loss_from_log_prob");
    auto [loss, stats, grad_log_prob, grad_value] =
        op.call(log_prob, entropy, value, old_log_prob, old_value, advantage, value_target,
                clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage);
    ctx->save_for_backward({grad_log_prob, grad_value});
    ctx->saved_data["ent_coef"] = ent_coef;
    ctx->mark_non_differentiable({stats, grad_log_prob, grad_value});
    return {loss, stats, grad_log_prob, grad_value};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(12);
    reject_double_backward("ppo_loss_from_log_prob", at::GradMode::is_enabled());
    static const auto op = native<BackwardSig>("nostall::ppo_loss_from_log_prob_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [grad_log_prob, grad_entropy, grad_value] =
        op.call(grads[0], s[0], s[1], ctx->saved_data["ent_coef"].toDouble());
    variable_list out(12);
    out[0] = grad_log_prob;
    out[1] = grad_entropy;
    out[2] = grad_value;
    return out;
  }
};

Tensor group_advantages_autograd(const Tensor& reward, const Tensor& group_index,
                                 int64_t num_groups, c10::string_view scale, double eps) {
  return GroupAdvantagesFunction::apply(reward, group_index, num_groups, std::string(scale), eps);
}

Pair token_log_prob_autograd(const Tensor& logits, const Tensor& tokens) {
  const variable_list out = TokenLogProbFunction::apply(logits, tokens);
  return {out[0], out[1]};
}

Pair token_log_prob_linear_autograd(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& tokens, int64_t chunk_size) {
  const variable_list out = TokenLogProbLinearFunction::apply(hidden, weight, tokens, chunk_size);
  return {out[0], out[1]};
}

Pair token_entropy_linear_autograd(const Tensor& hidden, const Tensor& weight, int64_t chunk_size) {
  const variable_list out = TokenEntropyLinearFunction::apply(hidden, weight, chunk_size);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> clipped_policy_loss_autograd(
    const Tensor& log_prob, const Tensor& old_log_prob, const Tensor& advantage, const Tensor& mask,
    double clip_low, double clip_high, c10::string_view aggregation, int64_t max_tokens,
    OptDouble dual_clip, const OptTensor& behavior_log_prob, double is_cap) {
  // Only log_prob is differentiated: a target that requires grad is refused, not silently
  // given no gradient.
  TORCH_CHECK(!any_requires_grad({&old_log_prob}),
              "old_log_prob must not require grad: clipped_policy_loss treats it as a constant "
              "(detach it)");
  TORCH_CHECK(!any_requires_grad({&advantage}),
              "advantage must not require grad: clipped_policy_loss treats it as a constant "
              "(detach it)");
  if (behavior_log_prob.has_value()) {
    TORCH_CHECK(!any_requires_grad({&*behavior_log_prob}),
                "behavior_log_prob must not require grad: clipped_policy_loss treats it as a "
                "constant (detach it)");
  }
  const variable_list out = PolicyLossFunction::apply(
      log_prob, old_log_prob, advantage, mask, clip_low, clip_high, std::string(aggregation),
      max_tokens, dual_clip, behavior_log_prob, is_cap);
  return {out[0], out[1], out[2], out[3]};
}

// The PPO losses differentiate the policy and the value only: a target that requires grad is
// refused, not silently given no gradient.
void reject_ppo_targets_with_grad(const char* op, const Tensor& old_log_prob,
                                  const Tensor& old_value, const Tensor& advantage,
                                  const Tensor& value_target) {
  const std::pair<const Tensor*, const char*> targets[] = {{&old_log_prob, "old_log_prob"},
                                                           {&old_value, "old_value"},
                                                           {&advantage, "advantage"},
                                                           {&value_target, "value_target"}};
  for (const auto& [t, name] : targets) {
    TORCH_CHECK(!any_requires_grad({t}), name, " must not require grad: ", op,
                " treats it as a constant (detach it)");
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> ppo_loss_autograd(
    const Tensor& logits, const Tensor& action, const Tensor& value, const Tensor& old_log_prob,
    const Tensor& old_value, const Tensor& advantage, const Tensor& value_target, double clip_coef,
    OptDouble value_clip, double ent_coef, double vf_coef, bool normalize_advantage) {
  reject_ppo_targets_with_grad("ppo_loss", old_log_prob, old_value, advantage, value_target);
  if (!any_requires_grad({&logits, &value})) {  // no graph to record: skip the node
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = native<PpoLossFunction::Sig>("nostall::ppo_loss");
    return op.call(logits, action, value, old_log_prob, old_value, advantage, value_target,
                   clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage);
  }
  const variable_list out = PpoLossFunction::apply(logits, action, value, old_log_prob, old_value,
                                                   advantage, value_target, clip_coef, value_clip,
                                                   ent_coef, vf_coef, normalize_advantage);
  return {out[0], out[1], out[2], out[3]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> ppo_loss_from_log_prob_autograd(
    const Tensor& log_prob, const Tensor& entropy, const Tensor& value, const Tensor& old_log_prob,
    const Tensor& old_value, const Tensor& advantage, const Tensor& value_target, double clip_coef,
    OptDouble value_clip, double ent_coef, double vf_coef, bool normalize_advantage) {
  reject_ppo_targets_with_grad("ppo_loss_from_log_prob", old_log_prob, old_value, advantage,
                               value_target);
  if (!any_requires_grad({&log_prob, &entropy, &value})) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = native<PpoLogProbLossFunction::Sig>("nostall::ppo_loss_from_log_prob");
    return op.call(log_prob, entropy, value, old_log_prob, old_value, advantage, value_target,
                   clip_coef, value_clip, ent_coef, vf_coef, normalize_advantage);
  }
  const variable_list out = PpoLogProbLossFunction::apply(
      log_prob, entropy, value, old_log_prob, old_value, advantage, value_target, clip_coef,
      value_clip, ent_coef, vf_coef, normalize_advantage);
  return {out[0], out[1], out[2], out[3]};
}

// Autograd kernels of the backward ops: refuse a second derivative, else run below autograd.
Tensor group_advantages_backward_autograd(const Tensor& grad, const Tensor& reward,
                                          const Tensor& group_index, int64_t num_groups,
                                          c10::string_view scale, double eps) {
  reject_double_backward("group_advantages", {&grad, &reward});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<GroupAdvantagesFunction::BackwardSig>("nostall::group_advantages_backward");
  return op.call(grad, reward, group_index, num_groups, scale, eps);
}

Tensor token_log_prob_backward_autograd(const Tensor& grad, const Tensor& logits,
                                        const Tensor& tokens, const Tensor& logsumexp) {
  reject_double_backward("token_log_prob", {&grad, &logits, &logsumexp});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<TokenLogProbFunction::BackwardSig>("nostall::token_log_prob_backward");
  return op.call(grad, logits, tokens, logsumexp);
}

Pair token_log_prob_linear_backward_autograd(const Tensor& grad, const Tensor& hidden,
                                             const Tensor& weight, const Tensor& tokens,
                                             const Tensor& logsumexp, int64_t chunk_size) {
  reject_double_backward("token_log_prob_linear", {&grad, &hidden, &weight, &logsumexp});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<TokenLogProbLinearFunction::BackwardSig>("nostall::token_log_prob_linear_backward");
  return op.call(grad, hidden, weight, tokens, logsumexp, chunk_size);
}

Pair token_entropy_linear_backward_autograd(const Tensor& grad, const Tensor& hidden,
                                            const Tensor& weight, const Tensor& entropy,
                                            const Tensor& logsumexp, int64_t chunk_size) {
  reject_double_backward("token_entropy_linear", {&grad, &hidden, &weight, &entropy, &logsumexp});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<TokenEntropyLinearFunction::BackwardSig>("nostall::token_entropy_linear_backward");
  return op.call(grad, hidden, weight, entropy, logsumexp, chunk_size);
}

Pair ppo_loss_backward_autograd(const Tensor& grad, const Tensor& grad_logits,
                                const Tensor& grad_value) {
  reject_double_backward("ppo_loss", {&grad, &grad_logits, &grad_value});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op = native<PpoLossFunction::BackwardSig>("nostall::ppo_loss_backward");
  return op.call(grad, grad_logits, grad_value);
}

Triple ppo_loss_from_log_prob_backward_autograd(const Tensor& grad, const Tensor& grad_log_prob,
                                                const Tensor& grad_value, double ent_coef) {
  reject_double_backward("ppo_loss_from_log_prob", {&grad, &grad_log_prob, &grad_value});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<PpoLogProbLossFunction::BackwardSig>("nostall::ppo_loss_from_log_prob_backward");
  return op.call(grad, grad_log_prob, grad_value, ent_coef);
}

Tensor clipped_policy_loss_backward_autograd(const Tensor& grad, const Tensor& token_grad,
                                             const Tensor& mask, c10::string_view aggregation,
                                             int64_t max_tokens) {
  reject_double_backward("clipped_policy_loss", {&grad, &token_grad});
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op =
      native<PolicyLossFunction::BackwardSig>("nostall::clipped_policy_loss_backward");
  return op.call(grad, token_grad, mask, aggregation, max_tokens);
}

}  // namespace
}  // namespace nostall::autograd

TORCH_LIBRARY_IMPL(nostall, Autograd, m) {
  m.impl("group_advantages", &nostall::autograd::group_advantages_autograd);
  m.impl("token_log_prob", &nostall::autograd::token_log_prob_autograd);
  m.impl("token_log_prob_linear", &nostall::autograd::token_log_prob_linear_autograd);
  m.impl("token_entropy_linear", &nostall::autograd::token_entropy_linear_autograd);
  m.impl("clipped_policy_loss", &nostall::autograd::clipped_policy_loss_autograd);
  m.impl("ppo_loss", &nostall::autograd::ppo_loss_autograd);
  m.impl("ppo_loss_backward", &nostall::autograd::ppo_loss_backward_autograd);
  m.impl("ppo_loss_from_log_prob", &nostall::autograd::ppo_loss_from_log_prob_autograd);
  m.impl("ppo_loss_from_log_prob_backward",
         &nostall::autograd::ppo_loss_from_log_prob_backward_autograd);
  m.impl("group_advantages_backward", &nostall::autograd::group_advantages_backward_autograd);
  m.impl("token_log_prob_backward", &nostall::autograd::token_log_prob_backward_autograd);
  m.impl("token_log_prob_linear_backward",
         &nostall::autograd::token_log_prob_linear_backward_autograd);
  m.impl("token_entropy_linear_backward",
         &nostall::autograd::token_entropy_linear_backward_autograd);
  m.impl("clipped_policy_loss_backward", &nostall::autograd::clipped_policy_loss_backward_autograd);
}
