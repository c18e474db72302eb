// CPU kernel of sample_categorical (see sample_categorical.h): rows in parallel.
#include "ops/sample_categorical.h"

#include <torch/csrc/stable/ops.h>

#include "common/tensor_utils.h"
#include "ops/sample_categorical_impl.h"

namespace nostall {

SampleOutput sample_categorical_cpu(Tensor logits, Tensor uniform) {
  check_sample_args(logits, uniform);
  const int64_t N = logits.size(0), A = logits.size(1);
  Tensor action = torch::stable::new_empty(logits, {N}, ScalarType::Long);
  Tensor log_prob = new_contiguous(logits, {N});
  Tensor logsumexp = new_contiguous(logits, {N});
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* x = logits.const_data_ptr<S>();
    const S* u = uniform.const_data_ptr<S>();
    const int64_t xs0 = logits.stride(0), xs1 = logits.stride(1);
    const int64_t us0 = uniform.stride(0), us1 = uniform.stride(1);
    int64_t* act = action.mutable_data_ptr<int64_t>();
    S* lp = log_prob.mutable_data_ptr<S>();
    S* lse = logsumexp.mutable_data_ptr<S>();
    const int64_t grain = A >= 4096 ? 1 : (int64_t{1} << 14) / A + 1;
    torch::stable::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        sample_row(x + n * xs0, xs1, u + n * us0, us1, A, act + n, lp + n, lse + n);
      }
    });
  });
  return {log_prob, action, logsumexp};
}

}  // namespace nostall
