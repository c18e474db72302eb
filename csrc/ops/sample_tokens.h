// Token sampling for language-model generation, with no host sync: one row of logits [B, V] per
// sequence, temperature, top-k and top-p (nucleus) truncation, then the Gumbel-max trick with the
// caller's uniform noise (so the caller's generator decides the stream of samples):
//
//   x[v]      = logits[b, v] / temperature  where allowed[v], else -inf
//   keep      = the top_k largest x (top_k = 0: all; ties at the k-th value are all kept), then the
//               smallest set of the largest kept x whose probability mass reaches top_p (1: all)
//   token[b]  = argmax_{v in keep} x[v] - log(-log(max(uniform[b, v], 1e-20)))
//   log_prob  = x[token] - logsumexp_{v allowed} x[v]
//
// The log-prob is the untruncated policy's (temperature, allowed tokens), the one a trainer
// computes from the same logits: with identical weights the behaviour/trainer ratio is 1, as in
// TRL, where top-k and top-p choose which token is drawn but not its recorded probability.
//
// Rows already finished get pad_token_id and log_prob 0; a row that samples eos_token_id is
// marked finished (in place), so a decode loop needs no host read to know which rows are done.
// `allowed` (bool [V]) lets the caller keep special tokens other than <eos> out of completions.
// Outputs (token int64 [B], log_prob float [B]); finished (bool [B]) is mutated.
#pragma once

#include <tuple>

#include "common/checks.h"

namespace nostall {

inline void check_sample_tokens_args(const Tensor& logits, const Tensor& uniform,
                                     const Tensor& finished, const Tensor& allowed,
                                     double temperature, int64_t top_k, double top_p,
                                     int64_t eos_token_id, int64_t pad_token_id) {
  STD_TORCH_CHECK(logits.dim() == 2, "logits must be [B, V], got ", logits.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(logits), "logits must be float32 or float64, got ",
                  torch::headeronly::toString(logits.scalar_type()));
  const int64_t B = logits.size(0), V = logits.size(1);
  STD_TORCH_CHECK(V >= 1, "logits must have at least one token");
  STD_TORCH_CHECK(uniform.dim() == 2 && uniform.size(0) == B && uniform.size(1) == V,
                  "uniform must have the shape of logits [", B, ", ", V, "]");
  STD_TORCH_CHECK(uniform.scalar_type() == logits.scalar_type(),
                  "uniform must have the dtype of logits (",
                  torch::headeronly::toString(logits.scalar_type()), "), got ",
                  torch::headeronly::toString(uniform.scalar_type()));
  STD_TORCH_CHECK(uniform.device() == logits.device(), "uniform must be on the device of logits");
  STD_TORCH_CHECK(finished.scalar_type() == ScalarType::Bool, "finished must be bool, got ",
                  torch::headeronly::toString(finished.scalar_type()));
  STD_TORCH_CHECK(finished.dim() == 1 && finished.size(0) == B, "finished must be [B] = [", B, "]");
  STD_TORCH_CHECK(finished.device() == logits.device(), "finished must be on the device of logits");
  STD_TORCH_CHECK(allowed.scalar_type() == ScalarType::Bool, "allowed must be bool, got ",
                  torch::headeronly::toString(allowed.scalar_type()));
  STD_TORCH_CHECK(allowed.dim() == 1 && allowed.size(0) == V, "allowed must be [V] = [", V, "]");
  STD_TORCH_CHECK(allowed.device() == logits.device(), "allowed must be on the device of logits");
  check_positive(temperature, "temperature");
  STD_TORCH_CHECK(top_k >= 0, "top_k must be >= 0 (0: no top-k), got ", top_k);
  STD_TORCH_CHECK(top_p > 0.0 && top_p <= 1.0, "top_p must lie in (0, 1], got ", top_p);
  STD_TORCH_CHECK(eos_token_id >= 0 && eos_token_id < V, "eos_token_id must lie in [0, ", V,
                  "), got ", eos_token_id);
  STD_TORCH_CHECK(pad_token_id >= 0 && pad_token_id < V, "pad_token_id must lie in [0, ", V,
                  "), got ", pad_token_id);
}

using SampleTokensOutput = std::tuple<Tensor, Tensor>;

SampleTokensOutput sample_tokens_cpu(Tensor logits, Tensor uniform, Tensor finished, Tensor allowed,
                                     double temperature, int64_t top_k, double top_p,
                                     int64_t eos_token_id, int64_t pad_token_id);
SampleTokensOutput sample_tokens_cuda(Tensor logits, Tensor uniform, Tensor finished,
                                      Tensor allowed, double temperature, int64_t top_k,
                                      double top_p, int64_t eos_token_id, int64_t pad_token_id);

}  // namespace nostall
