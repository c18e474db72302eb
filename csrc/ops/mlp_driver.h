// The MLP forward and adjoint (see mlp.h), argument checks included, over a device backend B that
// supplies the products and the fused elementwise passes:
//   B::linear(out, x, w, b)            out = x @ w^T + b
//   B::mm(out, a, b)                   out = a @ b
//   B::column_sum(out, g)              out[j] = sum_m g[m, j]
//   B::activate(h, act)                h = act(h), in place
//   B::activation_grad(g, h, act)      g *= act'(h), h the activation's output
// Every intermediate is allocated here and contiguous; the products take strided operands
// (weights enter the adjoint through transposed views, never copied).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/tensor_utils.h"
#include "ops/mlp.h"

namespace nostall {

// The forward on arguments already checked (check_mlp_args): the native rollout checks its
// networks once per chunk, then runs them at every step.
template <class B>
MlpOutput mlp_forward_checked(const Tensor& input, const std::vector<Tensor>& weights,
                              const std::vector<Tensor>& biases, Activation act) {
  const int64_t M = input.size(0);
  const size_t L = weights.size();
  std::vector<Tensor> hidden;
  hidden.reserve(L - 1);
  Tensor x = input;
  for (size_t i = 0; i < L; ++i) {
    Tensor y = new_contiguous(input, {M, weights[i].size(0)});
    B::linear(y, x, weights[i], biases[i]);
    if (i + 1 < L) {
      B::activate(y, act);
      hidden.push_back(y);
    }
    x = y;
  }
  return {x, std::move(hidden)};
}

template <class B>
MlpOutput mlp_forward(const Tensor& input, const std::vector<Tensor>& weights,
                      const std::vector<Tensor>& biases, const std::string& activation) {
  check_mlp_args(input, weights, biases, activation);
  return mlp_forward_checked<B>(input, weights, biases, parse_activation(activation));
}

template <class B>
MlpGrads mlp_backward(const Tensor& grad_output, const Tensor& input,
                      const std::vector<Tensor>& weights, const std::vector<Tensor>& hidden,
                      const std::string& activation, bool input_grad) {
  check_mlp_backward_args(grad_output, input, weights, hidden, activation);
  const Activation act = parse_activation(activation);
  const int64_t M = input.size(0);
  const size_t L = weights.size();
  std::vector<Tensor> grad_weights(L, input), grad_biases(L, input);  // placeholders, all set
  std::optional<Tensor> grad_input;
  Tensor g = grad_output;  // d/d (layer i's pre-activation), walking down from the last layer
  for (size_t i = L; i-- > 0;) {
    const Tensor& w = weights[i];
    const Tensor& below = i == 0 ? input : hidden[i - 1];
    grad_weights[i] = new_contiguous(w, {w.size(0), w.size(1)});
    B::mm(grad_weights[i], transposed(g), below);
    grad_biases[i] = new_contiguous(w, {w.size(0)});
    B::column_sum(grad_biases[i], g);
    if (i == 0 && !input_grad) break;
    Tensor down = new_contiguous(input, {M, w.size(1)});
    B::mm(down, g, w);
    if (i == 0) {
      grad_input = down;
    } else {
      B::activation_grad(down, hidden[i - 1], act);
      g = down;
    }
  }
  return {grad_input, std::move(grad_weights), std::move(grad_biases)};
}

}  // namespace nostall
