// Sampling from a categorical policy on the device, with no host sync: the Gumbel-max trick
// with the caller's uniform noise (so the caller's generator decides the stream of samples),
// and the sample's log-probability from the same pass over the logits:
//
//   action[n]   = argmax_a  logits[n, a] - log(-log(max(uniform[n, a], 1e-20)))
//   log_prob[n] = logits[n, action[n]] - logsumexp[n]
//
// (`Categorical.sample()` takes a multinomial path that reads scalars back: a sync per sample
// on CUDA.) Outputs (log_prob, action, logsumexp). Ties go to the lowest index, as torch.argmax;
// uniform outside [0, 1] or NaN logits give an unspecified action in [0, A). logsumexp [N] is kept
// for the backward, which is token_log_prob's: d log_prob / d logits = onehot(action) -
// softmax(logits).
#pragma once

#include <tuple>

#include "common/checks.h"

namespace nostall {

inline void check_sample_args(const Tensor& logits, const Tensor& uniform) {
  STD_TORCH_CHECK(logits.dim() == 2, "logits must be [N, A], got ", logits.dim(), " dimensions");
  STD_TORCH_CHECK(is_floating(logits), "logits must be float32 or float64, got ",
                  torch::headeronly::toString(logits.scalar_type()));
  STD_TORCH_CHECK(logits.size(1) >= 1, "logits must have at least one action");
  STD_TORCH_CHECK(
      uniform.dim() == 2 && uniform.size(0) == logits.size(0) && uniform.size(1) == logits.size(1),
      "uniform must have the shape of logits [", logits.size(0), ", ", logits.size(1), "]");
  STD_TORCH_CHECK(uniform.scalar_type() == logits.scalar_type(),
                  "uniform must have the dtype of logits (",
                  torch::headeronly::toString(logits.scalar_type()), "), got ",
                  torch::headeronly::toString(uniform.scalar_type()));
  STD_TORCH_CHECK(uniform.device() == logits.device(), "uniform must be on the device of logits");
}

using SampleOutput = std::tuple<Tensor, Tensor, Tensor>;

SampleOutput sample_categorical_cpu(Tensor logits, Tensor uniform);
SampleOutput sample_categorical_cuda(Tensor logits, Tensor uniform);

}  // namespace nostall
