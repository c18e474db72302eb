// Log-probability of chosen tokens under a softmax policy, without materialising the
// log-softmax:
//
//   log_prob[b, t]  = logits[b, t, tokens[b, t]] - logsumexp[b, t]
//   logsumexp[b, t] = log sum_v exp(logits[b, t, v])
//
// and its adjoint, d log_prob / d logits[v] = [v == token] - softmax(logits)[v]. Accumulation is
// float32 for float32 and bfloat16 logits, float64 for float64; log_prob and logsumexp have that
// accumulation dtype. The linear variant takes hidden [B, T, H] and the output weight [V, H] and
// computes the logits chunk by chunk of rows, so at most chunk_size * V logits exist at once
// (the fused linear + log-prob approach; the backward recomputes each chunk's logits).
//
// token_entropy_linear is the same walk for each row's entropy, an entropy bonus's input:
//
//   entropy[b, t] = -sum_v p[v] log p[v],  p = softmax(hidden[b, t] @ weight^T)
//
// with the adjoint d entropy / d logits[v] = -p[v] (log p[v] + entropy).
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"

namespace nostall {

inline bool is_logits_dtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::BFloat16;
}

// float64 stays float64; float32 and bfloat16 accumulate in float32.
inline ScalarType accumulation_dtype(ScalarType t) {
  return t == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

inline void check_tokens(const Tensor& tokens, const Tensor& ref, const char* ref_name) {
  STD_TORCH_CHECK(tokens.scalar_type() == ScalarType::Long, "tokens must be int64, got ",
                  torch::headeronly::toString(tokens.scalar_type()));
  STD_TORCH_CHECK(
      tokens.dim() == 2 && tokens.size(0) == ref.size(0) && tokens.size(1) == ref.size(1),
      "tokens must be [B, T] = [", ref.size(0), ", ", ref.size(1), "], matching ", ref_name);
  STD_TORCH_CHECK(tokens.device() == ref.device(), "tokens must be on the device of ", ref_name);
}

inline void check_token_log_prob_args(const Tensor& logits, const Tensor& tokens) {
  STD_TORCH_CHECK(logits.dim() == 3, "logits must be [B, T, V], got ", logits.dim(), " dimensions");
  STD_TORCH_CHECK(is_logits_dtype(logits.scalar_type()),
                  "logits must be float32, float64 or bfloat16, got ",
                  torch::headeronly::toString(logits.scalar_type()));
  STD_TORCH_CHECK(logits.size(2) >= 1, "logits must have a vocabulary of at least one token");
  check_tokens(tokens, logits, "logits");
}

// A [B, T] accumulation-dtype tensor produced by the forward (log_prob, logsumexp, their grads).
inline void check_row_values(const Tensor& t, const char* name, const Tensor& ref,
                             const char* ref_name) {
  STD_TORCH_CHECK(t.dim() == 2 && t.size(0) == ref.size(0) && t.size(1) == ref.size(1), name,
                  " must be [B, T] = [", ref.size(0), ", ", ref.size(1), "], matching ", ref_name);
  STD_TORCH_CHECK(t.scalar_type() == accumulation_dtype(ref.scalar_type()), name, " must be ",
                  torch::headeronly::toString(accumulation_dtype(ref.scalar_type())), ", got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.device() == ref.device(), name, " must be on the device of ", ref_name);
}

inline void check_token_log_prob_backward_args(const Tensor& grad_log_prob, const Tensor& logits,
                                               const Tensor& tokens, const Tensor& logsumexp) {
  check_token_log_prob_args(logits, tokens);
  check_row_values(grad_log_prob, "grad_log_prob", logits, "logits");
  check_row_values(logsumexp, "logsumexp", logits, "logits");
}

// hidden [B, T, H] and the output weight [V, H] of the linear variants.
inline void check_hidden_and_weight(const Tensor& hidden, const Tensor& weight,
                                    int64_t chunk_size) {
  STD_TORCH_CHECK(hidden.dim() == 3, "hidden must be [B, T, H], got ", hidden.dim(), " dimensions");
  STD_TORCH_CHECK(is_logits_dtype(hidden.scalar_type()),
                  "hidden must be float32, float64 or bfloat16, got ",
                  torch::headeronly::toString(hidden.scalar_type()));
  STD_TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(2),
                  "weight must be [V, H] with H = ", hidden.size(2),
                  " (the last dimension of hidden)");
  STD_TORCH_CHECK(weight.size(0) >= 1, "weight must have a vocabulary of at least one token");
  STD_TORCH_CHECK(weight.scalar_type() == hidden.scalar_type(),
                  "weight must have the dtype of hidden (",
                  torch::headeronly::toString(hidden.scalar_type()), "), got ",
                  torch::headeronly::toString(weight.scalar_type()));
  STD_TORCH_CHECK(weight.device() == hidden.device(), "weight must be on the device of hidden");
  STD_TORCH_CHECK(chunk_size >= 1, "chunk_size must be >= 1, got ", chunk_size);
}

inline void check_linear_args(const Tensor& hidden, const Tensor& weight, const Tensor& tokens,
                              int64_t chunk_size) {
  check_hidden_and_weight(hidden, weight, chunk_size);
  check_tokens(tokens, hidden, "hidden");
}

inline void check_linear_backward_args(const Tensor& grad_log_prob, const Tensor& hidden,
                                       const Tensor& weight, const Tensor& tokens,
                                       const Tensor& logsumexp, int64_t chunk_size) {
  check_linear_args(hidden, weight, tokens, chunk_size);
  check_row_values(grad_log_prob, "grad_log_prob", hidden, "hidden");
  check_row_values(logsumexp, "logsumexp", hidden, "hidden");
}

inline void check_entropy_backward_args(const Tensor& grad_entropy, const Tensor& hidden,
                                        const Tensor& weight, const Tensor& entropy,
                                        const Tensor& logsumexp, int64_t chunk_size) {
  check_hidden_and_weight(hidden, weight, chunk_size);
  check_row_values(grad_entropy, "grad_entropy", hidden, "hidden");
  check_row_values(entropy, "entropy", hidden, "hidden");
  check_row_values(logsumexp, "logsumexp", hidden, "hidden");
}

// [B, T] outputs of the accumulation dtype, on the device of `like`.
inline Tensor new_row_values(const Tensor& like) {
  return torch::stable::new_empty(like, {like.size(0), like.size(1)},
                                  accumulation_dtype(like.scalar_type()));
}

std::tuple<Tensor, Tensor> token_log_prob_cpu(Tensor logits, Tensor tokens);
Tensor token_log_prob_backward_cpu(Tensor grad_log_prob, Tensor logits, Tensor tokens,
                                   Tensor logsumexp);
std::tuple<Tensor, Tensor> token_log_prob_linear_cpu(Tensor hidden, Tensor weight, Tensor tokens,
                                                     int64_t chunk_size);
std::tuple<Tensor, Tensor> token_log_prob_linear_backward_cpu(Tensor grad_log_prob, Tensor hidden,
                                                              Tensor weight, Tensor tokens,
                                                              Tensor logsumexp, int64_t chunk_size);
std::tuple<Tensor, Tensor> token_entropy_linear_cpu(Tensor hidden, Tensor weight,
                                                    int64_t chunk_size);
std::tuple<Tensor, Tensor> token_entropy_linear_backward_cpu(Tensor grad_entropy, Tensor hidden,
                                                             Tensor weight, Tensor entropy,
                                                             Tensor logsumexp, int64_t chunk_size);

std::tuple<Tensor, Tensor> token_log_prob_cuda(Tensor logits, Tensor tokens);
Tensor token_log_prob_backward_cuda(Tensor grad_log_prob, Tensor logits, Tensor tokens,
                                    Tensor logsumexp);
std::tuple<Tensor, Tensor> token_log_prob_linear_cuda(Tensor hidden, Tensor weight, Tensor tokens,
                                                      int64_t chunk_size);
std::tuple<Tensor, Tensor> token_log_prob_linear_backward_cuda(Tensor grad_log_prob, Tensor hidden,
                                                               Tensor weight, Tensor tokens,
                                                               Tensor logsumexp,
                                                               int64_t chunk_size);

std::tuple<Tensor, Tensor> token_entropy_linear_cuda(Tensor hidden, Tensor weight,
                                                     int64_t chunk_size);
std::tuple<Tensor, Tensor> token_entropy_linear_backward_cuda(Tensor grad_entropy, Tensor hidden,
                                                              Tensor weight, Tensor entropy,
                                                              Tensor logsumexp, int64_t chunk_size);

}  // namespace nostall
