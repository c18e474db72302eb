// CUDA kernels of ppo_loss (see ppo_loss.h): one kernel for the advantages' mean and spread (one
// block), one with a thread per sample that writes its derivatives and a block's partial sums to
// a [blocks, 5] table, and one thread that combines the table in a fixed order, so the loss is
// deterministic. Everything stays on the device: no host sync.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include "common/cuda_launch.cuh"
#include "common/cuda_reduce.cuh"
#include "common/tensor_utils.h"
#include "ops/ppo_loss.h"

namespace nostall {

namespace {

constexpr int kSums = 5;

template <typename S>
struct SamplePtrs {
  const S* logits;
  const int64_t* action;
  const S *value, *old_log_prob, *old_value, *advantage, *value_target;
  int64_t M, A;
};

// normaliser[0..1] = (shift, scale) of the advantages.
template <typename S>
__global__ void advantage_kernel(const S* advantage, int64_t M, double* normaliser) {
  double sum = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) sum += advantage[m];
  const double mean = block_all_reduce(sum, SumOp{}) / static_cast<double>(M);
  double dev = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const double d = advantage[m] - mean;
    dev += d * d;
  }
  dev = block_all_reduce(dev, SumOp{});
  if (threadIdx.x == 0) {
    S shift, scale;
    advantage_normaliser(mean, dev, M, &shift, &scale);
    normaliser[0] = shift;
    normaliser[1] = scale;
  }
}

// The block's sums into its row of the [blocks, kSums] table.
__device__ void write_block_sums(const PpoSums& sums, double* partial) {
  const double pg = block_all_reduce(sums.pg, SumOp{});
  const double v_err = block_all_reduce(sums.v_err, SumOp{});
  const double entropy = block_all_reduce(sums.entropy, SumOp{});
  const double kl = block_all_reduce(sums.kl, SumOp{});
  const double clipped = block_all_reduce(sums.clipped, SumOp{});
  if (threadIdx.x == 0) {
    double* row = partial + blockIdx.x * kSums;
    row[0] = pg;
    row[1] = v_err;
    row[2] = entropy;
    row[3] = kl;
    row[4] = clipped;
  }
}

template <typename S>
__global__ void sample_kernel(SamplePtrs<S> in, PpoLossConfig cfg, const double* normaliser,
                              S* grad_logits, S* grad_value, double* partial) {
  const int64_t m = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const S shift = normaliser ? S(normaliser[0]) : S(0);
  const S scale = normaliser ? S(normaliser[1]) : S(1);
  PpoSums sums;
  if (m < in.M) {
    ppo_sample<S>(in.logits + m * in.A, in.A, in.action[m], in.value[m], in.old_log_prob[m],
                  in.old_value[m], in.advantage[m], in.value_target[m], shift, scale, cfg,
                  S(1) / static_cast<S>(in.M), grad_logits + m * in.A, grad_value + m, sums);
  }
  write_block_sums(sums, partial);
}

template <typename S>
struct LogProbPtrs {
  const S *log_prob, *entropy, *value, *old_log_prob, *old_value, *advantage, *value_target;
  int64_t M;
};

template <typename S>
__global__ void log_prob_sample_kernel(LogProbPtrs<S> in, PpoLossConfig cfg,
                                       const double* normaliser, S* grad_log_prob, S* grad_value,
                                       double* partial) {
  const int64_t m = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const S shift = normaliser ? S(normaliser[0]) : S(0);
  const S scale = normaliser ? S(normaliser[1]) : S(1);
  PpoSums sums;
  if (m < in.M) {
    grad_log_prob[m] = ppo_terms<S>(in.log_prob[m], in.entropy[m], in.value[m], in.old_log_prob[m],
                                    in.old_value[m], in.advantage[m], in.value_target[m], shift,
                                    scale, cfg, S(1) / static_cast<S>(in.M), grad_value + m, sums);
  }
  write_block_sums(sums, partial);
}

template <typename S>
__global__ void finish_kernel(const double* partial, int64_t blocks, int64_t M, PpoLossConfig cfg,
                              S* loss, S* stats) {
  PpoSums s;
  for (int64_t b = 0; b < blocks; ++b) {
    const double* row = partial + b * kSums;
    s.pg += row[0];
    s.v_err += row[1];
    s.entropy += row[2];
    s.kl += row[3];
    s.clipped += row[4];
  }
  ppo_finish<S>(s, M, cfg, loss, stats);
}

template <typename S>
__global__ void scale_kernel(const S* grad_loss, const S* in, S* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = *grad_loss * in[i];
}

// out[i] = grad_loss * factor, the entropy's constant derivative.
template <typename S>
__global__ void fill_scaled_kernel(const S* grad_loss, S factor, S* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = *grad_loss * factor;
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kRowThreads - 1) / kRowThreads);
}

// Both losses on the device: the advantage normaliser (when asked), then
// launch_samples(blocks, normaliser or null, partial) for the per-sample kernel, then the fixed-
// order sums into loss and stats. `like` gives the scratch's device.
template <typename S, typename LaunchSamples>
void run_ppo_kernels(const PpoLossConfig& c, int64_t M, const Tensor& like, const Tensor& advantage,
                     Tensor& loss, Tensor& stats, cudaStream_t stream, const char* op,
                     LaunchSamples&& launch_samples) {
  const unsigned blocks = blocks_for(M);
  Tensor scratch =
      torch::stable::new_empty(like, {2 + int64_t{blocks} * kSums}, ScalarType::Double);
  double* normaliser = scratch.mutable_data_ptr<double>();
  double* partial = normaliser + 2;
  if (c.normalize) {
    advantage_kernel<S>
        <<<1, kRowThreads, 0, stream>>>(advantage.const_data_ptr<S>(), M, normaliser);
    check_launch(op);
  }
  launch_samples(blocks, c.normalize ? normaliser : nullptr, partial);
  check_launch(op);
  finish_kernel<S><<<1, 1, 0, stream>>>(partial, blocks, M, c, loss.mutable_data_ptr<S>(),
                                        stats.mutable_data_ptr<S>());
  check_launch(op);
}

}  // namespace

PpoLossOutput ppo_loss_cuda(Tensor logits, Tensor action, Tensor value, Tensor old_log_prob,
                            Tensor old_value, Tensor advantage, Tensor value_target,
                            double clip_coef, std::optional<double> value_clip, double ent_coef,
                            double vf_coef, bool normalize_advantage) {
  const PpoLossConfig c = checked_ppo_loss_config(logits, action, value, old_log_prob, old_value,
                                                  advantage, value_target, clip_coef, value_clip,
                                                  ent_coef, vf_coef, normalize_advantage);
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  const int64_t M = logits.size(0), A = logits.size(1);
  logits = as_contiguous(logits);
  action = as_contiguous(action);
  value = as_contiguous(value);
  old_log_prob = as_contiguous(old_log_prob);
  old_value = as_contiguous(old_value);
  advantage = as_contiguous(advantage);
  value_target = as_contiguous(value_target);
  PpoLossOutput out = new_ppo_outputs(logits, {M, A}, M);
  Tensor &loss = std::get<0>(out), &stats = std::get<1>(out), &grad_logits = std::get<2>(out),
         &grad_value = std::get<3>(out);
  const cudaStream_t stream = current_stream(logits);
  dispatch_floating(logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const SamplePtrs<S> in{logits.const_data_ptr<S>(),
                           action.const_data_ptr<int64_t>(),
                           value.const_data_ptr<S>(),
                           old_log_prob.const_data_ptr<S>(),
                           old_value.const_data_ptr<S>(),
                           advantage.const_data_ptr<S>(),
                           value_target.const_data_ptr<S>(),
                           M,
                           A};
    run_ppo_kernels<S>(c, M, logits, advantage, loss, stats, stream, "ppo_loss",
                       [&](unsigned blocks, const double* normaliser, double* partial) {
                         sample_kernel<S><<<blocks, kRowThreads, 0, stream>>>(
                             in, c, normaliser, grad_logits.mutable_data_ptr<S>(),
                             grad_value.mutable_data_ptr<S>(), partial);
                       });
  });
  return out;
}

PpoLossOutput ppo_loss_from_log_prob_cuda(Tensor log_prob, Tensor entropy, Tensor value,
                                          Tensor old_log_prob, Tensor old_value, Tensor advantage,
                                          Tensor value_target, double clip_coef,
                                          std::optional<double> value_clip, double ent_coef,
                                          double vf_coef, bool normalize_advantage) {
  const PpoLossConfig c = checked_ppo_log_prob_config(
      log_prob, entropy, value, old_log_prob, old_value, advantage, value_target, clip_coef,
      value_clip, ent_coef, vf_coef, normalize_advantage);
  torch::stable::accelerator::DeviceGuard guard(log_prob.get_device_index());
  const int64_t M = log_prob.size(0);
  log_prob = as_contiguous(log_prob);
  entropy = as_contiguous(entropy);
  value = as_contiguous(value);
  old_log_prob = as_contiguous(old_log_prob);
  old_value = as_contiguous(old_value);
  advantage = as_contiguous(advantage);
  value_target = as_contiguous(value_target);
  PpoLossOutput out = new_ppo_outputs(log_prob, {M}, M);
  Tensor &loss = std::get<0>(out), &stats = std::get<1>(out), &grad_log_prob = std::get<2>(out),
         &grad_value = std::get<3>(out);
  const cudaStream_t stream = current_stream(log_prob);
  dispatch_floating(log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const LogProbPtrs<S> in{log_prob.const_data_ptr<S>(),     entropy.const_data_ptr<S>(),
                            value.const_data_ptr<S>(),        old_log_prob.const_data_ptr<S>(),
                            old_value.const_data_ptr<S>(),    advantage.const_data_ptr<S>(),
                            value_target.const_data_ptr<S>(), M};
    run_ppo_kernels<S>(c, M, log_prob, advantage, loss, stats, stream, "ppo_loss_from_log_prob",
                       [&](unsigned blocks, const double* normaliser, double* partial) {
                         log_prob_sample_kernel<S><<<blocks, kRowThreads, 0, stream>>>(
                             in, c, normaliser, grad_log_prob.mutable_data_ptr<S>(),
                             grad_value.mutable_data_ptr<S>(), partial);
                       });
  });
  return out;
}

PpoLogProbGrads ppo_loss_from_log_prob_backward_cuda(Tensor grad_loss, Tensor grad_log_prob,
                                                     Tensor grad_value, double ent_coef) {
  check_ppo_log_prob_backward_args(grad_loss, grad_log_prob, grad_value);
  torch::stable::accelerator::DeviceGuard guard(grad_log_prob.get_device_index());
  const int64_t M = grad_log_prob.size(0);
  grad_log_prob = as_contiguous(grad_log_prob);
  grad_value = as_contiguous(grad_value);
  Tensor out_log_prob = new_contiguous(grad_log_prob, {M});
  Tensor out_entropy = new_contiguous(grad_log_prob, {M});
  Tensor out_value = new_contiguous(grad_log_prob, {M});
  const cudaStream_t stream = current_stream(grad_log_prob);
  dispatch_floating(grad_log_prob.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const S* g = grad_loss.const_data_ptr<S>();
    scale_kernel<S><<<blocks_for(M), kRowThreads, 0, stream>>>(
        g, grad_log_prob.const_data_ptr<S>(), out_log_prob.mutable_data_ptr<S>(), M);
    fill_scaled_kernel<S><<<blocks_for(M), kRowThreads, 0, stream>>>(
        g, static_cast<S>(-ent_coef / static_cast<double>(M)), out_entropy.mutable_data_ptr<S>(),
        M);
    scale_kernel<S><<<blocks_for(M), kRowThreads, 0, stream>>>(g, grad_value.const_data_ptr<S>(),
                                                               out_value.mutable_data_ptr<S>(), M);
    check_launch("ppo_loss_from_log_prob_backward");
  });
  return {out_log_prob, out_entropy, out_value};
}

std::tuple<Tensor, Tensor> ppo_loss_backward_cuda(Tensor grad_loss, Tensor grad_logits,
                                                  Tensor grad_value) {
  check_ppo_loss_backward_args(grad_loss, grad_logits, grad_value);
  torch::stable::accelerator::DeviceGuard guard(grad_logits.get_device_index());
  grad_logits = as_contiguous(grad_logits);
  grad_value = as_contiguous(grad_value);
  Tensor out_logits = new_contiguous(grad_logits, {grad_logits.size(0), grad_logits.size(1)});
  Tensor out_value = new_contiguous(grad_value, {grad_value.size(0)});
  const cudaStream_t stream = current_stream(grad_logits);
  dispatch_floating(grad_logits.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    const int64_t n_logits = grad_logits.numel(), n_value = grad_value.numel();
    scale_kernel<S><<<blocks_for(n_logits), kRowThreads, 0, stream>>>(
        grad_loss.const_data_ptr<S>(), grad_logits.const_data_ptr<S>(),
        out_logits.mutable_data_ptr<S>(), n_logits);
    scale_kernel<S><<<blocks_for(n_value), kRowThreads, 0, stream>>>(
        grad_loss.const_data_ptr<S>(), grad_value.const_data_ptr<S>(),
        out_value.mutable_data_ptr<S>(), n_value);
    check_launch("ppo_loss_backward");
  });
  return {out_logits, out_value};
}

}  // namespace nostall
