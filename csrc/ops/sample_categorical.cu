// CUDA kernel of sample_categorical: one thread per row, on the current stream.
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "common/tensor_utils.h"
#include "ops/sample_categorical.h"
#include "ops/sample_categorical_impl.h"

namespace nostall {

namespace {

template <typename S>
__global__ void sample_kernel(const S* x, int64_t xs0, int64_t xs1, const S* u, int64_t us0,
                              int64_t us1, int64_t N, int64_t A, int64_t* action, S* log_prob,
                              S* logsumexp) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (n < N) {
    sample_row(x + n * xs0, xs1, u + n * us0, us1, A, action + n, log_prob + n, logsumexp + n);
  }
}

}  // namespace

SampleOutput sample_categorical_cuda(Tensor logits, Tensor uniform) {
  // Kernels and GEMMs launch on the current device: make it the inputs' one.
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  check_sample_args(logits, uniform);
  const int64_t N = logits.size(0), A = logits.size(1);
  Tensor action = torch::stable::new_empty(logits, {N}, ScalarType::Long);
  Tensor log_prob = new_contiguous(logits, {N});
  Tensor logsumexp = new_contiguous(logits, {N});
  if (N == 0) return {log_prob, action, logsumexp};
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    sample_kernel<S><<<column_blocks(N), kColumnThreads, 0, current_stream(logits)>>>(
        logits.const_data_ptr<S>(), logits.stride(0), logits.stride(1), uniform.const_data_ptr<S>(),
        uniform.stride(0), uniform.stride(1), N, A, action.mutable_data_ptr<int64_t>(),
        log_prob.mutable_data_ptr<S>(), logsumexp.mutable_data_ptr<S>());
  });
  check_launch("sample_categorical");
  return {log_prob, action, logsumexp};
}

}  // namespace nostall
