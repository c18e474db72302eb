// A multilayer perceptron in one call: the policy and value networks of classic RL (CleanRL's
// Linear-Tanh-Linear-Tanh-Linear) are a dozen tiny ops per evaluation, each a dispatcher call
// that costs more than its arithmetic at rollout batch sizes. For L layers, input x [M, K]:
//
//   h_0 = x,  h_i = act(h_{i-1} W_i^T + b_i)  (i < L),  output = h_{L-1} W_L^T + b_L
//
// with W_i [J_i, J_{i-1}], b_i [J_i], act tanh or relu. The forward returns the hidden
// activations h_1 .. h_{L-1} for the backward. The adjoint, from g = d/d output:
//
//   grad_W_i = g_i^T h_{i-1},  grad_b_i = sum_rows g_i,  g_{i-1} = (g_i W_i) * act'(h_{i-1})
//
// (act' from the activation's output: 1 - h^2 for tanh, [h > 0] for relu). float32 or float64;
// the matrix products are torch's (BLAS on the CPU, cuBLAS on CUDA), the rest is fused here.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/checks.h"

namespace nostall {

enum class Activation { kTanh, kRelu };

inline Activation parse_activation(const std::string& activation) {
  if (activation == "tanh") return Activation::kTanh;
  STD_TORCH_CHECK(activation == "relu", "activation must be 'tanh' or 'relu', got '", activation,
                  "'");
  return Activation::kRelu;
}

inline void check_mlp_args(const Tensor& input, const std::vector<Tensor>& weights,
                           const std::vector<Tensor>& biases, const std::string& activation) {
  parse_activation(activation);
  STD_TORCH_CHECK(input.dim() == 2, "input must be [M, K], got ", input.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(input), "input must be float32 or float64, got ",
                  torch::headeronly::toString(input.scalar_type()));
  STD_TORCH_CHECK(!weights.empty(), "weights must hold at least one layer");
  STD_TORCH_CHECK(biases.size() == weights.size(), "biases must have one tensor per weight (",
                  weights.size(), "), got ", biases.size());
  int64_t width = input.size(1);
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor& w = weights[i];
    const Tensor& b = biases[i];
    STD_TORCH_CHECK(w.dim() == 2 && w.size(1) == width, "weights[", i, "] must be a [J, ", width,
                    "] matrix (",
                    i == 0 ? "the last dimension of input" : "the previous layer's width", ")");
    STD_TORCH_CHECK(w.size(0) >= 1, "weights[", i, "] must have at least one output unit");
    STD_TORCH_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "biases[", i, "] must be [", w.size(0),
                    "], matching weights[", i, "]");
    STD_TORCH_CHECK(
        w.scalar_type() == input.scalar_type() && b.scalar_type() == input.scalar_type(),
        "weights[", i, "] and biases[", i, "] must have the dtype of input (",
        torch::headeronly::toString(input.scalar_type()), ")");
    STD_TORCH_CHECK(w.device() == input.device() && b.device() == input.device(), "weights[", i,
                    "] and biases[", i, "] must be on the device of input");
    width = w.size(0);
  }
}

inline void check_mlp_backward_args(const Tensor& grad_output, const Tensor& input,
                                    const std::vector<Tensor>& weights,
                                    const std::vector<Tensor>& hidden,
                                    const std::string& activation) {
  parse_activation(activation);
  STD_TORCH_CHECK(input.dim() == 2, "input must be [M, K], got ", input.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(input), "input must be float32 or float64, got ",
                  torch::headeronly::toString(input.scalar_type()));
  STD_TORCH_CHECK(!weights.empty(), "weights must hold at least one layer");
  STD_TORCH_CHECK(hidden.size() + 1 == weights.size(), "hidden must hold ", weights.size() - 1,
                  " activations (one per layer but the last), got ", hidden.size());
  const int64_t M = input.size(0);
  int64_t width = input.size(1);
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor& w = weights[i];
    STD_TORCH_CHECK(w.dim() == 2 && w.size(1) == width, "weights[", i, "] must be a [J, ", width,
                    "] matrix (",
                    i == 0 ? "the last dimension of input" : "the previous layer's width", ")");
    STD_TORCH_CHECK(w.scalar_type() == input.scalar_type() && w.device() == input.device(),
                    "weights[", i, "] must have the dtype and device of input");
    width = w.size(0);
    if (i + 1 < weights.size()) {
      const Tensor& h = hidden[i];
      STD_TORCH_CHECK(h.dim() == 2 && h.size(0) == M && h.size(1) == width, "hidden[", i,
                      "] must be [", M, ", ", width, "]");
      STD_TORCH_CHECK(h.scalar_type() == input.scalar_type() && h.device() == input.device(),
                      "hidden[", i, "] must have the dtype and device of input");
    }
  }
  STD_TORCH_CHECK(
      grad_output.dim() == 2 && grad_output.size(0) == M && grad_output.size(1) == width,
      "grad_output must be [", M, ", ", width, "], the output's shape");
  STD_TORCH_CHECK(
      grad_output.scalar_type() == input.scalar_type() && grad_output.device() == input.device(),
      "grad_output must have the dtype and device of input");
}

using MlpOutput = std::tuple<Tensor, std::vector<Tensor>>;
using MlpGrads = std::tuple<std::optional<Tensor>, std::vector<Tensor>, std::vector<Tensor>>;

MlpOutput mlp_cpu(Tensor input, std::vector<Tensor> weights, std::vector<Tensor> biases,
                  std::string activation);
// mlp_cpu on arguments that passed check_mlp_args (the native rollout's per-step calls).
MlpOutput mlp_cpu_checked(const Tensor& input, const std::vector<Tensor>& weights,
                          const std::vector<Tensor>& biases, Activation act);
MlpGrads mlp_backward_cpu(Tensor grad_output, Tensor input, std::vector<Tensor> weights,
                          std::vector<Tensor> hidden, std::string activation, bool input_grad);

MlpOutput mlp_cuda(Tensor input, std::vector<Tensor> weights, std::vector<Tensor> biases,
                   std::string activation);
MlpGrads mlp_backward_cuda(Tensor grad_output, Tensor input, std::vector<Tensor> weights,
                           std::vector<Tensor> hidden, std::string activation, bool input_grad);

}  // namespace nostall
