// CUDA kernels for clipped_policy_loss and its adjoint. One block per sequence writes that
// sequence's sums to a [B, kRowSums] table; one block then combines the table in a fixed order,
// so results are deterministic. Normalisers are read on the device: no host sync.
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

template <typename S>
__global__ void row_sums_kernel(LossPtrs<S> in, ClipConfig cfg, double* sums) {
  const int64_t b = blockIdx.x;
  double loss = 0, tokens = 0, clipped = 0, kl = 0;
  for (int64_t t = threadIdx.x; t < in.T; t += blockDim.x) {
    const int64_t i = b * in.T + t;
    if (!in.mask[i]) continue;
    const TokenTerms<S> k = in.terms(b, i, cfg);
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
__global__ void log_prob_grad_kernel(LossPtrs<S> in, ClipConfig cfg, const S* grad_loss,
                                     const double* counts, S* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= in.B * in.T) return;
  const int64_t b = i / in.T;
  if (!in.mask[i]) {
    out[i] = S(0);
    return;
  }
  const S weight = static_cast<S>(sequence_weight(cfg, in.B, counts[b], counts[in.B]));
  out[i] = *grad_loss * in.terms(b, i, cfg).dloss * weight;
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

std::tuple<Tensor, Tensor, Tensor> clipped_policy_loss_cuda(
    Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, double clip_low,
    double clip_high, std::string aggregation, int64_t max_tokens, std::optional<double> dual_clip,
    std::optional<Tensor> behavior_log_prob, double is_cap) {
  check_policy_loss_args(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  const ClipConfig cfg = clip_config(clip_low, clip_high, dual_clip, behavior_log_prob.has_value(),
                                     is_cap, aggregation, max_tokens);
  torch::stable::accelerator::DeviceGuard guard(log_prob.get_device_index());
  log_prob = as_contiguous(log_prob);
  old_log_prob = as_contiguous(old_log_prob);
  advantage = as_contiguous(advantage);
  mask = as_contiguous(mask);
  if (behavior_log_prob.has_value()) behavior_log_prob = as_contiguous(*behavior_log_prob);
  const int64_t B = log_prob.size(0);
  Tensor loss = torch::stable::new_empty(log_prob, {});
  Tensor clip_fraction = torch::stable::new_empty(log_prob, {});
  Tensor approx_kl = torch::stable::new_empty(log_prob, {});
  Tensor sums =
      torch::stable::new_empty(log_prob, {B * kRowSums}, torch::headeronly::ScalarType::Double);
  const cudaStream_t stream = current_stream(log_prob);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const LossPtrs<S> in = loss_ptrs<S>(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
    row_sums_kernel<S><<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(
        in, cfg, sums.mutable_data_ptr<double>());
    combine_kernel<S><<<1, kRowThreads, 0, stream>>>(sums.const_data_ptr<double>(), B, cfg,
                                                     out_ptr<S>(loss), out_ptr<S>(clip_fraction),
                                                     out_ptr<S>(approx_kl));
  });
  check_launch("clipped_policy_loss kernels");
  return {loss, clip_fraction, approx_kl};
}

Tensor clipped_policy_loss_backward_cuda(Tensor grad_loss, Tensor log_prob, Tensor old_log_prob,
                                         Tensor advantage, Tensor mask, double clip_low,
                                         double clip_high, std::string aggregation,
                                         int64_t max_tokens, std::optional<double> dual_clip,
                                         std::optional<Tensor> behavior_log_prob, double is_cap) {
  check_policy_loss_args(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
  STD_TORCH_CHECK(grad_loss.dim() == 0 && grad_loss.scalar_type() == log_prob.scalar_type(),
                  "grad_loss must be a scalar tensor with the dtype of log_prob");
  STD_TORCH_CHECK(grad_loss.device() == log_prob.device(),
                  "grad_loss must be on the device of log_prob");
  const ClipConfig cfg = clip_config(clip_low, clip_high, dual_clip, behavior_log_prob.has_value(),
                                     is_cap, aggregation, max_tokens);
  torch::stable::accelerator::DeviceGuard guard(log_prob.get_device_index());
  log_prob = as_contiguous(log_prob);
  old_log_prob = as_contiguous(old_log_prob);
  advantage = as_contiguous(advantage);
  mask = as_contiguous(mask);
  if (behavior_log_prob.has_value()) behavior_log_prob = as_contiguous(*behavior_log_prob);
  const int64_t B = log_prob.size(0);
  const int64_t n = B * log_prob.size(1);
  Tensor grad_log_prob = torch::stable::empty_like(log_prob);
  Tensor counts =
      torch::stable::new_empty(log_prob, {B + 1}, torch::headeronly::ScalarType::Double);
  const cudaStream_t stream = current_stream(log_prob);
  row_counts_kernel<<<static_cast<unsigned>(B), kRowThreads, 0, stream>>>(
      mask.const_data_ptr<bool>(), log_prob.size(1), counts.mutable_data_ptr<double>());
  token_total_kernel<<<1, kRowThreads, 0, stream>>>(counts.mutable_data_ptr<double>(), B);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const LossPtrs<S> in = loss_ptrs<S>(log_prob, old_log_prob, advantage, mask, behavior_log_prob);
    log_prob_grad_kernel<S><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        in, cfg, grad_loss.const_data_ptr<S>(), counts.const_data_ptr<double>(),
        out_ptr<S>(grad_log_prob));
  });
  check_launch("clipped_policy_loss_backward kernels");
  return grad_log_prob;
}

}  // namespace nostall
