// CUDA kernels for clipped_policy_loss and its adjoint. One block per sequence writes that
// sequence's sums to a [B, kRowSums] table, and each token's derivative; one block then
// combines the table in a fixed order, so results are deterministic. The adjoint scales the
// saved derivatives by each sequence's weight. Normalisers are read on the device: no sync.
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "common/cuda_reduce.cuh"
#include "common/tensor_utils.h"
#include "ops/policy_loss.h"

namespace nostall {

namespace {

// Pointers of the loss inputs; adv_stride 0 means one advantage per sequence.
template <typename S>
struct LossPtrs {
  const S* lp;
  const S* old;
  const S* adv;
  const bool* mask;
  const S* behavior;  // null without a behaviour policy
  int64_t B, T, adv_stride;

  __device__ TokenTerms<S> terms(int64_t b, int64_t i, const ClipConfig& cfg) const {
    const S w = behavior ? truncated_is_weight(old[i], behavior[i], cfg) : S(1);
    return clipped_token(lp[i], old[i], adv[adv_stride ? i : b], w, cfg);
  }
};

// Also writes every token's derivative (0 where masked) to token_grad, for the backward.
template <typename S>
__global__ void row_sums_kernel(LossPtrs<S> in, ClipConfig cfg, double* sums, S* token_grad) {
  const int64_t b = blockIdx.x;
  double loss = 0, tokens = 0, clipped = 0, kl = 0;
  for (int64_t t = threadIdx.x; t < in.T; t += blockDim.x) {
    const int64_t i = b * in.T + t;
    if (!in.mask[i]) {
      token_grad[i] = S(0);
      continue;
    }
    const TokenTerms<S> k = in.terms(b, i, cfg);
    token_grad[i] = k.dloss;
    loss += k.loss;
    tokens += 1;
    clipped += k.clipped;
    kl += k.kl;
  }
  loss = block_all_reduce(loss, SumOp{});
  tokens = block_all_reduce(tokens, SumOp{});
  clipped = block_all_reduce(clipped, SumOp{});
  kl = block_all_reduce(kl, SumOp{});
  if (threadIdx.x == 0) {
    double* row = sums + b * kRowSums;
    row[0] = loss;
    row[1] = tokens;
    row[2] = clipped;
    row[3] = kl;
  }
}

// Combines the [B, kRowSums] table: total tokens first, then the weighted sums.
template <typename S>
__global__ void combine_kernel(const double* sums, int64_t B, ClipConfig cfg, S* loss,
                               S* clip_fraction, S* approx_kl) {
  double total = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) total += sums[b * kRowSums + 1];
  total = block_all_reduce(total, SumOp{});
  double l = 0, clipped = 0, kl = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
    const double* row = sums + b * kRowSums;
    l += row[0] * sequence_weight(cfg, B, row[1], total);
    clipped += row[2];
    kl += row[3];
  }
  l = block_all_reduce(l, SumOp{});
  clipped = block_all_reduce(clipped, SumOp{});
  kl = block_all_reduce(kl, SumOp{});
  if (threadIdx.x == 0) {
    const double per_token = 1.0 / (total > 1.0 ? total : 1.0);
    *loss = static_cast<S>(l);
    *clip_fraction = static_cast<S>(clipped * per_token);
    *approx_kl = static_cast<S>(kl * per_token);
  }
}

// counts[b] = unmasked tokens of sequence b; counts[B] = their total (written by block 0 after
// a second pass in token_total_kernel).
__global__ void row_counts_kernel(const bool* mask, int64_t T, double* counts) {
  const int64_t b = blockIdx.x;
  double n = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) n += mask[b * T + t];
  n = block_all_reduce(n, SumOp{});
  if (threadIdx.x == 0) counts[b] = n;
}

__global__ void token_total_kernel(double* counts, int64_t B) {
  double total = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) total += counts[b];
  total = block_all_reduce(total, SumOp{});
  if (threadIdx.x == 0) counts[B] = total;
}

template <typename S>
__global__ void scale_grad_kernel(const S* token_grad, const S* grad_loss, const double* counts,
                                  ClipConfig cfg, int64_t B, int64_t T, S* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * T) return;
  const int64_t b = i / T;
  out[i] =
      *grad_loss * token_grad[i] * static_cast<S>(sequence_weight(cfg, B, counts[b], counts[B]));
}

template <typename S>
LossPtrs<S> loss_ptrs(const Tensor& lp, const Tensor& old, const Tensor& adv, const Tensor& mask,
                      const std::optional<Tensor>& behavior) {
  return {lp.const_data_ptr<S>(),
          old.const_data_ptr<S>(),
          adv.const_data_ptr<S>(),
          mask.const_data_ptr<bool>(),
          behavior.has_value() ? behavior->const_data_ptr<S>() : nullptr,
          lp.size(0),
          lp.size(1),
          adv.dim() == 2 ? 1 : 0};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> clipped_policy_loss_cuda(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap) {
  const ClipConfig cfg =
      checked_clip_config(log_prob, old_log_prob, advantage, mask, behavior_log_prob, clip_low,
                          clip_high, dual_clip, is_cap, aggregation, max_tokens);
  torch::stable::accelerator::DeviceGuard guard(log_prob.get_device_index());
  log_prob = as_contiguous(log_prob);
  old_log_prob = as_contiguous(old_log_prob);
  advantage = as_contiguous(advantage);
  mask = as_contiguous(mask);
  if (behavior_log_prob.has_value()) behavior_log_prob = as_contiguous(*behavior_log_prob);
  const int64_t B = log_prob.size(0);
  LossOutputs out(log_prob);
  Tensor sums =
      torch::stable::new_empty(log_prob, {B * kRowSums}, torch::headeronly::ScalarType::Double);
  const cudaStream_t stream = current_stream(log_prob);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const LossPtrs<S> in = loss_ptrs<S>(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
    row_sums_kernel<S><<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(
        in, cfg, sums.mutable_data_ptr<double>(), out_ptr<S>(out.token_grad));
    combine_kernel<S>
        <<<1, kRowThreads, 0, stream>>>(sums.const_data_ptr<double>(), B, cfg, out_ptr<S>(out.loss),
                                        out_ptr<S>(out.clip_fraction), out_ptr<S>(out.approx_kl));
  });
  check_launch("clipped_policy_loss kernels");
  return out.tuple();
}

Tensor clipped_policy_loss_backward_cuda(Tensor grad_loss, Tensor token_grad, Tensor mask,
                                         std::string aggregation, int64_t max_tokens) {
  check_policy_loss_backward_args(grad_loss, token_grad, mask, aggregation, max_tokens);
  const ClipConfig cfg = aggregation_config(aggregation, max_tokens);
  torch::stable::accelerator::DeviceGuard guard(token_grad.get_device_index());
  token_grad = as_contiguous(token_grad);
  mask = as_contiguous(mask);
  const int64_t B = token_grad.size(0);
  const int64_t T = token_grad.size(1);
  Tensor grad_log_prob = torch::stable::empty_like(token_grad);
  Tensor counts =
      torch::stable::new_empty(token_grad, {B + 1}, torch::headeronly::ScalarType::Double);
  const cudaStream_t stream = current_stream(token_grad);
  row_counts_kernel<<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(
      mask.const_data_ptr<bool>(), T, counts.mutable_data_ptr<double>());
  token_total_kernel<<<1, kRowThreads, 0, stream>>>(counts.mutable_data_ptr<double>(), B);
  dispatch_floating(token_grad.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    scale_grad_kernel<S><<<static_cast<unsigned>((B * T + 255) / 256), 256, 0, stream>>>(
        token_grad.const_data_ptr<S>(), grad_loss.const_data_ptr<S>(),
        counts.const_data_ptr<double>(), cfg, B, T, out_ptr<S>(grad_log_prob));
  });
  check_launch("clipped_policy_loss_backward kernels");
  return grad_log_prob;
}

}  // namespace nostall
