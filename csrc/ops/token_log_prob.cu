// CUDA kernels for token_log_prob, its adjoint, the chunked linear variant and
// token_entropy_linear: one block per row of V logits (max, sum of exponentials, then the chosen
// token or the entropy), on the current stream.
// A token out of [0, V) gives NaN for its row instead of an error: checking would need a host
// sync (the CPU kernels raise).
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "common/cuda_launch.cuh"
#include "common/cuda_reduce.cuh"
#include "common/tensor_utils.h"
#include "ops/token_log_prob.h"
#include "ops/token_log_prob_drivers.h"

namespace nostall {

namespace {

__device__ inline float load_acc(float x) { return x; }
__device__ inline double load_acc(double x) { return x; }
__device__ inline float load_acc(c10::BFloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.x) << 16);
}

template <typename S, typename A>
__device__ inline S store_as(A x) {
  return static_cast<S>(x);
}
template <>
__device__ inline c10::BFloat16 store_as<c10::BFloat16, float>(float x) {
  return c10::BFloat16(x);  // round to nearest even
}

__device__ inline float exp_acc(float x) { return expf(x); }
__device__ inline double exp_acc(double x) { return exp(x); }
__device__ inline float log_acc(float x) { return logf(x); }
__device__ inline double log_acc(double x) { return log(x); }

// The logsumexp of one row of V logits, the block's threads striding over it (max, then the
// sum of exponentials); every thread gets it.
template <typename S, typename A>
__device__ A block_row_logsumexp(const S* row, int64_t V) {
  A m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = MaxOp{}(m, load_acc(row[v]));
  m = block_all_reduce(m, MaxOp{});
  A s = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += exp_acc(load_acc(row[v]) - m);
  s = block_all_reduce(s, SumOp{});
  return m + log_acc(s);
}

template <typename S, typename A>
__global__ void log_prob_rows_kernel(const S* __restrict__ x, const int64_t* __restrict__ tok,
                                     A* __restrict__ lp, A* __restrict__ lse, int64_t V) {
  const int64_t r = blockIdx.x;
  const S* row = x + r * V;
  const A l = block_row_logsumexp<S, A>(row, V);
  if (threadIdx.x == 0) {
    const int64_t t = tok[r];
    lse[r] = l;
    lp[r] = (t >= 0 && t < V) ? load_acc(row[t]) - l : A(NAN);
  }
}

// out may alias x: each element is read and then written by the same thread.
template <typename S, typename A>
__global__ void log_prob_grad_kernel(const A* __restrict__ g, const S* x,
                                     const int64_t* __restrict__ tok, const A* __restrict__ lse,
                                     S* out, int64_t V) {
  const int64_t r = blockIdx.x;
  const A gr = g[r];
  const A l = lse[r];
  const int64_t t = tok[r];
  const bool valid = t >= 0 && t < V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const int64_t i = r * V + v;
    const A grad = (v == t ? gr : A(0)) - gr * exp_acc(load_acc(x[i]) - l);
    out[i] = store_as<S>(valid ? grad : A(NAN));
  }
}

// One row's logsumexp and entropy: max, sum of exponentials, then -sum p log p with the row's
// lse (a term is 0 where p is exactly 0, as on the CPU).
template <typename S, typename A>
__global__ void entropy_rows_kernel(const S* __restrict__ x, A* __restrict__ ent,
                                    A* __restrict__ lse, int64_t V) {
  const int64_t r = blockIdx.x;
  const S* row = x + r * V;
  const A l = block_row_logsumexp<S, A>(row, V);
  A h = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const A y = load_acc(row[v]) - l;
    const A p = exp_acc(y);
    h -= p == A(0) ? A(0) : p * y;
  }
  h = block_all_reduce(h, SumOp{});
  if (threadIdx.x == 0) {
    lse[r] = l;
    ent[r] = h;
  }
}

// out[v] = -g p[v] (log p[v] + entropy); out may alias x (each element read, then written, by
// the same thread).
template <typename S, typename A>
__global__ void entropy_grad_kernel(const A* __restrict__ g, const S* x, const A* __restrict__ ent,
                                    const A* __restrict__ lse, S* out, int64_t V) {
  const int64_t r = blockIdx.x;
  const A gr = g[r];
  const A l = lse[r];
  const A h = ent[r];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const int64_t i = r * V + v;
    const A y = load_acc(x[i]) - l;
    const A p = exp_acc(y);
    out[i] = store_as<S>(p == A(0) ? A(0) : -gr * p * (y + h));
  }
}

template <typename S, typename A>
__global__ void accumulate_kernel(A* __restrict__ acc, const S* __restrict__ x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc[i] += load_acc(x[i]);
  }
}

// The CUDA row kernels for the shared drivers (see token_log_prob_drivers.h).
struct CudaRows {
  static void forward(const Tensor& logits, const Tensor& tokens, Tensor& log_prob,
                      Tensor& logsumexp) {
    const int64_t M = logits.size(0);
    if (M == 0) return;
    const cudaStream_t stream = current_stream(logits);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      log_prob_rows_kernel<S, A><<<static_cast<unsigned>(M), kRowThreads, 0, stream>>>(
          logits.const_data_ptr<S>(), tokens.const_data_ptr<int64_t>(),
          log_prob.mutable_data_ptr<A>(), logsumexp.mutable_data_ptr<A>(), logits.size(1));
    });
    check_launch("log_prob_rows_kernel");
  }

  static void backward(const Tensor& grad_log_prob, const Tensor& logits, const Tensor& tokens,
                       const Tensor& logsumexp, Tensor& grad_logits) {
    const int64_t M = logits.size(0);
    if (M == 0) return;
    const cudaStream_t stream = current_stream(logits);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      log_prob_grad_kernel<S, A><<<static_cast<unsigned>(M), kRowThreads, 0, stream>>>(
          grad_log_prob.const_data_ptr<A>(), logits.const_data_ptr<S>(),
          tokens.const_data_ptr<int64_t>(), logsumexp.const_data_ptr<A>(),
          grad_logits.mutable_data_ptr<S>(), logits.size(1));
    });
    check_launch("log_prob_grad_kernel");
  }

  static void entropy_forward(const Tensor& logits, Tensor& entropy, Tensor& logsumexp) {
    const int64_t M = logits.size(0);
    if (M == 0) return;
    const cudaStream_t stream = current_stream(logits);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      entropy_rows_kernel<S, A><<<static_cast<unsigned>(M), kRowThreads, 0, stream>>>(
          logits.const_data_ptr<S>(), entropy.mutable_data_ptr<A>(),
          logsumexp.mutable_data_ptr<A>(), logits.size(1));
    });
    check_launch("entropy_rows_kernel");
  }

  static void entropy_backward(const Tensor& grad_entropy, const Tensor& logits,
                               const Tensor& entropy, const Tensor& logsumexp,
                               Tensor& grad_logits) {
    const int64_t M = logits.size(0);
    if (M == 0) return;
    const cudaStream_t stream = current_stream(logits);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      entropy_grad_kernel<S, A><<<static_cast<unsigned>(M), kRowThreads, 0, stream>>>(
          grad_entropy.const_data_ptr<A>(), logits.const_data_ptr<S>(), entropy.const_data_ptr<A>(),
          logsumexp.const_data_ptr<A>(), grad_logits.mutable_data_ptr<S>(), logits.size(1));
    });
    check_launch("entropy_grad_kernel");
  }

  static void mm_into(Tensor& out, const Tensor& a, const Tensor& b) {
    STD_TORCH_CHECK(aoti_torch_cuda_mm_out(out.get(), a.get(), b.get()) == AOTI_TORCH_SUCCESS,
                    "token_log_prob_linear: matrix product failed");
  }

  // acc += a @ b: in place (addmm) when the product has acc's dtype, else through a product
  // in the inputs' dtype, widened into acc.
  static void accumulate_product(Tensor& acc, const Tensor& a, const Tensor& b) {
    if (a.scalar_type() == acc.scalar_type()) {
      STD_TORCH_CHECK(aoti_torch_cuda_addmm_out(acc.get(), acc.get(), a.get(), b.get(), 1.0, 1.0) ==
                          AOTI_TORCH_SUCCESS,
                      "token_log_prob_linear: matrix product failed");
    } else {
      accumulate(acc, torch::stable::matmul(a, b));
    }
  }

  static void accumulate(Tensor& acc, const Tensor& x) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const cudaStream_t stream = current_stream(x);
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
    dispatch_logits(x.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      accumulate_kernel<S, A><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
          acc.mutable_data_ptr<A>(), x.const_data_ptr<S>(), n);
    });
    check_launch("accumulate_kernel");
  }
};

}  // namespace

std::tuple<Tensor, Tensor> token_log_prob_cuda(Tensor logits, Tensor tokens) {
  check_token_log_prob_args(logits, tokens);
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  return logits_log_prob_forward<CudaRows>(logits, tokens);
}

Tensor token_log_prob_backward_cuda(Tensor grad_log_prob, Tensor logits, Tensor tokens,
                                    Tensor logsumexp) {
  check_token_log_prob_backward_args(grad_log_prob, logits, tokens, logsumexp);
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  return logits_log_prob_backward<CudaRows>(grad_log_prob, logits, tokens, logsumexp);
}

std::tuple<Tensor, Tensor> token_log_prob_linear_cuda(Tensor hidden, Tensor weight, Tensor tokens,
                                                      int64_t chunk_size) {
  check_linear_args(hidden, weight, tokens, chunk_size);
  torch::stable::accelerator::DeviceGuard guard(hidden.get_device_index());
  return linear_log_prob_forward<CudaRows>(hidden, weight, tokens, chunk_size);
}

std::tuple<Tensor, Tensor> token_log_prob_linear_backward_cuda(Tensor grad_log_prob, Tensor hidden,
                                                               Tensor weight, Tensor tokens,
                                                               Tensor logsumexp,
                                                               int64_t chunk_size) {
  check_linear_backward_args(grad_log_prob, hidden, weight, tokens, logsumexp, chunk_size);
  torch::stable::accelerator::DeviceGuard guard(hidden.get_device_index());
  return linear_log_prob_backward<CudaRows>(grad_log_prob, hidden, weight, tokens, logsumexp,
                                            chunk_size);
}

std::tuple<Tensor, Tensor> token_entropy_linear_cuda(Tensor hidden, Tensor weight,
                                                     int64_t chunk_size) {
  check_hidden_and_weight(hidden, weight, chunk_size);
  torch::stable::accelerator::DeviceGuard guard(hidden.get_device_index());
  return linear_entropy_forward<CudaRows>(hidden, weight, chunk_size);
}

std::tuple<Tensor, Tensor> token_entropy_linear_backward_cuda(Tensor grad_entropy, Tensor hidden,
                                                              Tensor weight, Tensor entropy,
                                                              Tensor logsumexp,
                                                              int64_t chunk_size) {
  check_entropy_backward_args(grad_entropy, hidden, weight, entropy, logsumexp, chunk_size);
  torch::stable::accelerator::DeviceGuard guard(hidden.get_device_index());
  return linear_entropy_backward<CudaRows>(grad_entropy, hidden, weight, entropy, logsumexp,
                                           chunk_size);
}

}  // namespace nostall
