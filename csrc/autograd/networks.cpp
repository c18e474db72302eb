// Autograd kernels of the policy-network ops. mlp: gradients to input (when it requires grad),
// every weight and every bias, through the native mlp_backward; the hidden activations the
// forward returns are saved for the backward and are not differentiable outputs themselves.
// sample_categorical: the log-probability is differentiable in the logits (the action and the
// logsumexp are not), through token_log_prob's native backward.
#include <optional>
#include <string>
#include <vector>

#include "autograd/native.h"

namespace nostall::autograd {
namespace {

using MlpOut = std::tuple<Tensor, std::vector<Tensor>>;
using MlpSig = MlpOut(const Tensor&, at::TensorList, at::TensorList, c10::string_view);
using MlpGrads = std::tuple<std::optional<Tensor>, std::vector<Tensor>, std::vector<Tensor>>;
using MlpBackwardSig = MlpGrads(const Tensor&, const Tensor&, at::TensorList, at::TensorList,
                                c10::string_view, bool);

// Saved variables: input, the L weights, the L - 1 hidden activations.
struct MlpFunction : torch::autograd::Function<MlpFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, at::TensorList weights,
                               at::TensorList biases, const std::string& activation) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);
    static const auto op = native<MlpSig>("nostall::mlp");
    auto [output, hidden] = op.call(input, weights, biases, activation);
    variable_list saved{input};
    saved.insert(saved.end(), weights.begin(), weights.end());
    saved.insert(saved.end(), hidden.begin(), hidden.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["layers"] = static_cast<int64_t>(weights.size());
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["input_grad"] = input.requires_grad();
    ctx->mark_non_differentiable(hidden);
    variable_list out{output};
    out.insert(out.end(), hidden.begin(), hidden.end());
    return out;
  }

  // Inputs of forward, flattened by apply: input, then each weight, then each bias (a
  // TensorList argument contributes one gradient slot per element), then the activation.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t L = ctx->saved_data["layers"].toInt();
    variable_list result(1 + 2 * L + 1);
    if (!grads[0].defined()) return result;
    static const auto op = native<MlpBackwardSig>("nostall::mlp_backward");
    const variable_list s = ctx->get_saved_variables();
    const std::vector<Tensor> weights(s.begin() + 1, s.begin() + 1 + L);
    const std::vector<Tensor> hidden(s.begin() + 1 + L, s.end());
    auto [grad_input, grad_weights, grad_biases] =
        op.call(grads[0], s[0], weights, hidden, ctx->saved_data["activation"].toStringRef(),
                ctx->saved_data["input_grad"].toBool());
    if (grad_input.has_value()) result[0] = *grad_input;
    for (int64_t i = 0; i < L; ++i) {
      result[1 + i] = grad_weights[i];
      result[1 + L + i] = grad_biases[i];
    }
    return result;
  }
};

MlpOut mlp_autograd(const Tensor& input, at::TensorList weights, at::TensorList biases,
                    c10::string_view activation) {
  if (!any_requires_grad({&input}) && !any_requires_grad(weights) && !any_requires_grad(biases)) {
    // Inference (a rollout step): no graph node, saved tensors or output wrapping.
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = native<MlpSig>("nostall::mlp");
    return op.call(input, weights, biases, activation);
  }
  const variable_list out = MlpFunction::apply(input, weights, biases, std::string(activation));
  return {out[0], std::vector<Tensor>(out.begin() + 1, out.end())};
}

MlpGrads mlp_backward_autograd(const Tensor& grad_output, const Tensor& input,
                               at::TensorList weights, at::TensorList hidden,
                               c10::string_view activation, bool input_grad) {
  reject_double_backward("mlp", any_requires_grad({&grad_output, &input}) ||
                                    any_requires_grad(weights) || any_requires_grad(hidden));
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op = native<MlpBackwardSig>("nostall::mlp_backward");
  return op.call(grad_output, input, weights, hidden, activation, input_grad);
}

using SampleSig = Triple(const Tensor&, const Tensor&);
using TokenLogProbBackwardSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&);

struct SampleCategoricalFunction : torch::autograd::Function<SampleCategoricalFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& uniform) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->set_materialize_grads(false);
    static const auto op = native<SampleSig>("nostall::sample_categorical");
    auto [log_prob, action, logsumexp] = op.call(logits, uniform);
    ctx->save_for_backward({logits, action, logsumexp});
    ctx->mark_non_differentiable({action, logsumexp});
    return {log_prob, action, logsumexp};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(2);
    static const auto op = native<TokenLogProbBackwardSig>("nostall::token_log_prob_backward");
    const variable_list s = ctx->get_saved_variables();
    // token_log_prob's adjoint over a batch of one sequence: [N, A] logits as [1, N, A].
    const Tensor grad =
        op.call(grads[0].unsqueeze(0), s[0].unsqueeze(0), s[1].unsqueeze(0), s[2].unsqueeze(0));
    return {grad.squeeze(0), Tensor()};
  }
};

Triple sample_categorical_autograd(const Tensor& logits, const Tensor& uniform) {
  TORCH_CHECK(!any_requires_grad({&uniform}),
              "uniform must not require grad: sample_categorical treats the noise as a constant "
              "(detach it)");
  if (!any_requires_grad({&logits})) {
    at::AutoDispatchBelowADInplaceOrView below;  // a rollout step: no graph node
    static const auto op = native<SampleSig>("nostall::sample_categorical");
    return op.call(logits, uniform);
  }
  const variable_list out = SampleCategoricalFunction::apply(logits, uniform);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace nostall::autograd

TORCH_LIBRARY_IMPL(nostall, Autograd, m) {
  m.impl("sample_categorical", &nostall::autograd::sample_categorical_autograd);
  m.impl("mlp", &nostall::autograd::mlp_autograd);
  m.impl("mlp_backward", &nostall::autograd::mlp_backward_autograd);
}
