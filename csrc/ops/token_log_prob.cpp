// CPU kernels for token_log_prob, its adjoint, the chunked linear variant and
// token_entropy_linear. Rows are independent: bands of rows run in parallel, and each row is two
// vectorised passes over its V logits (max, then sum of exponentials) forward, a third for the
// entropy, and one pass backward (cpu_rows.h).
#include "ops/token_log_prob.h"

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>

#include "common/cpu_math.h"
#include "common/tensor_utils.h"
#include "ops/cpu_rows.h"
#include "ops/token_log_prob_drivers.h"

namespace nostall {

namespace {

// logsumexp of one row: the vectorised kernels for float32 and bfloat16, a plain loop for
// float64 (used for gradient checks, where exactness matters more than speed).
float row_logsumexp(const float* x, int64_t V) { return rows::kernels().logsumexp_f32(x, V); }

float row_logsumexp(const c10::BFloat16* x, int64_t V) {
  return rows::kernels().logsumexp_bf16(reinterpret_cast<const uint16_t*>(x), V);
}

double row_logsumexp(const double* x, int64_t V) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - m);
  return m + std::log(sum);
}

// out[v] = -g * softmax(x)[v] over one row; out may alias x.
void row_softmax_grad(const float* x, float* out, int64_t V, float g, float lse) {
  rows::kernels().softmax_grad_f32(x, out, V, g, lse);
}

void row_softmax_grad(const c10::BFloat16* x, c10::BFloat16* out, int64_t V, float g, float lse) {
  rows::kernels().softmax_grad_bf16(reinterpret_cast<const uint16_t*>(x),
                                    reinterpret_cast<uint16_t*>(out), V, g, lse);
}

void row_softmax_grad(const double* x, double* out, int64_t V, double g, double lse) {
  for (int64_t v = 0; v < V; ++v) out[v] = -g * std::exp(x[v] - lse);
}

float row_entropy(const float* x, int64_t V, float lse) {
  return rows::kernels().entropy_f32(x, V, lse);
}

float row_entropy(const c10::BFloat16* x, int64_t V, float lse) {
  return rows::kernels().entropy_bf16(reinterpret_cast<const uint16_t*>(x), V, lse);
}

// p log p is 0 where p is (see cpu_rows_impl.h's p_log_p).
double row_entropy(const double* x, int64_t V, double lse) {
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double y = x[v] - lse;
    const double p = std::exp(y);
    sum += p == 0 ? 0 : p * y;
  }
  return -sum;
}

// out[v] = -g * p[v] * (log p[v] + entropy); out may alias x.
void row_entropy_grad(const float* x, float* out, int64_t V, float g, float lse, float h) {
  rows::kernels().entropy_grad_f32(x, out, V, g, lse, h);
}

void row_entropy_grad(const c10::BFloat16* x, c10::BFloat16* out, int64_t V, float g, float lse,
                      float h) {
  rows::kernels().entropy_grad_bf16(reinterpret_cast<const uint16_t*>(x),
                                    reinterpret_cast<uint16_t*>(out), V, g, lse, h);
}

void row_entropy_grad(const double* x, double* out, int64_t V, double g, double lse, double h) {
  for (int64_t v = 0; v < V; ++v) {
    const double y = x[v] - lse;
    const double p = std::exp(y);
    out[v] = p == 0 ? 0 : -g * p * (y + h);
  }
}

// Rows per parallel task: about 32k logits each.
int64_t row_grain(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 15) / V); }

void check_token_range(const Tensor& tokens, int64_t V) {
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  const int64_t n = tokens.numel();
  for (int64_t i = 0; i < n; ++i) {
    STD_TORCH_CHECK(tok[i] >= 0 && tok[i] < V, "tokens must lie in [0, V = ", V,
                    "), got tokens[flat index ", i, "] = ", tok[i]);
  }
}

// The CPU row kernels for the shared drivers (see token_log_prob_drivers.h).
struct CpuRows {
  static void forward(const Tensor& logits, const Tensor& tokens, Tensor& log_prob,
                      Tensor& logsumexp) {
    const int64_t M = logits.size(0);
    const int64_t V = logits.size(1);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const S* x = logits.const_data_ptr<S>();
      const int64_t* tok = tokens.const_data_ptr<int64_t>();
      A* lp = log_prob.mutable_data_ptr<A>();
      A* lse = logsumexp.mutable_data_ptr<A>();
      torch::stable::parallel_for(0, M, row_grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const S* row = x + r * V;
          lse[r] = row_logsumexp(row, V);
          lp[r] = to_acc(row[tok[r]]) - lse[r];
        }
      });
    });
  }

  static void backward(const Tensor& grad_log_prob, const Tensor& logits, const Tensor& tokens,
                       const Tensor& logsumexp, Tensor& grad_logits) {
    const int64_t M = logits.size(0);
    const int64_t V = logits.size(1);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const S* x = logits.const_data_ptr<S>();
      const int64_t* tok = tokens.const_data_ptr<int64_t>();
      const A* g = grad_log_prob.const_data_ptr<A>();
      const A* lse = logsumexp.const_data_ptr<A>();
      S* out = grad_logits.mutable_data_ptr<S>();  // may be x itself: read before written
      torch::stable::parallel_for(0, M, row_grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const S* row = x + r * V;
          S* out_row = out + r * V;
          const A gr = g[r];
          const A l = lse[r];
          // Read before the row is overwritten: out may alias x.
          const A chosen = std::exp(to_acc(row[tok[r]]) - l);
          row_softmax_grad(row, out_row, V, gr, l);
          out_row[tok[r]] = from_acc<S>(gr * (A(1) - chosen));
        }
      });
    });
  }

  static void entropy_forward(const Tensor& logits, Tensor& entropy, Tensor& logsumexp) {
    const int64_t M = logits.size(0);
    const int64_t V = logits.size(1);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const S* x = logits.const_data_ptr<S>();
      A* ent = entropy.mutable_data_ptr<A>();
      A* lse = logsumexp.mutable_data_ptr<A>();
      torch::stable::parallel_for(0, M, row_grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          lse[r] = row_logsumexp(x + r * V, V);
          ent[r] = row_entropy(x + r * V, V, lse[r]);
        }
      });
    });
  }

  static void entropy_backward(const Tensor& grad_entropy, const Tensor& logits,
                               const Tensor& entropy, const Tensor& logsumexp,
                               Tensor& grad_logits) {
    const int64_t M = logits.size(0);
    const int64_t V = logits.size(1);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const S* x = logits.const_data_ptr<S>();
      const A* g = grad_entropy.const_data_ptr<A>();
      const A* ent = entropy.const_data_ptr<A>();
      const A* lse = logsumexp.const_data_ptr<A>();
      S* out = grad_logits.mutable_data_ptr<S>();  // may be x itself: each element read first
      torch::stable::parallel_for(0, M, row_grain(V), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          row_entropy_grad(x + r * V, out + r * V, V, g[r], lse[r], ent[r]);
        }
      });
    });
  }

  static void mm_into(Tensor& out, const Tensor& a, const Tensor& b) {
    STD_TORCH_CHECK(aoti_torch_cpu_mm_out(out.get(), a.get(), b.get()) == AOTI_TORCH_SUCCESS,
                    "token_log_prob_linear: matrix product failed");
  }

  // acc += a @ b: in place (addmm) when the product has acc's dtype, else through a product
  // in the inputs' dtype, widened into acc.
  static void accumulate_product(Tensor& acc, const Tensor& a, const Tensor& b) {
    if (a.scalar_type() == acc.scalar_type()) {
      STD_TORCH_CHECK(aoti_torch_cpu_addmm_out(acc.get(), acc.get(), a.get(), b.get(), 1.0, 1.0) ==
                          AOTI_TORCH_SUCCESS,
                      "token_log_prob_linear: matrix product failed");
    } else {
      accumulate(acc, torch::stable::matmul(a, b));
    }
  }

  static void accumulate(Tensor& acc, const Tensor& x) {
    const int64_t n = x.numel();
    dispatch_logits(x.scalar_type(), [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      A* a = acc.mutable_data_ptr<A>();
      const S* src = x.const_data_ptr<S>();
      torch::stable::parallel_for(0, n, int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) a[i] += to_acc(src[i]);
      });
    });
  }
};

}  // namespace

std::tuple<Tensor, Tensor> token_log_prob_cpu(Tensor logits, Tensor tokens) {
  check_token_log_prob_args(logits, tokens);
  check_token_range(as_contiguous(tokens), logits.size(2));
  return logits_log_prob_forward<CpuRows>(logits, tokens);
}

Tensor token_log_prob_backward_cpu(Tensor grad_log_prob, Tensor logits, Tensor tokens,
                                   Tensor logsumexp) {
  check_token_log_prob_backward_args(grad_log_prob, logits, tokens, logsumexp);
  check_token_range(as_contiguous(tokens), logits.size(2));
  return logits_log_prob_backward<CpuRows>(grad_log_prob, logits, tokens, logsumexp);
}

std::tuple<Tensor, Tensor> token_log_prob_linear_cpu(Tensor hidden, Tensor weight, Tensor tokens,
                                                     int64_t chunk_size) {
  check_linear_args(hidden, weight, tokens, chunk_size);
  check_token_range(as_contiguous(tokens), weight.size(0));
  return linear_log_prob_forward<CpuRows>(hidden, weight, tokens, chunk_size);
}

std::tuple<Tensor, Tensor> token_log_prob_linear_backward_cpu(Tensor grad_log_prob, Tensor hidden,
                                                              Tensor weight, Tensor tokens,
                                                              Tensor logsumexp,
                                                              int64_t chunk_size) {
  check_linear_backward_args(grad_log_prob, hidden, weight, tokens, logsumexp, chunk_size);
  check_token_range(as_contiguous(tokens), weight.size(0));
  return linear_log_prob_backward<CpuRows>(grad_log_prob, hidden, weight, tokens, logsumexp,
                                           chunk_size);
}

std::tuple<Tensor, Tensor> token_entropy_linear_cpu(Tensor hidden, Tensor weight,
                                                    int64_t chunk_size) {
  check_hidden_and_weight(hidden, weight, chunk_size);
  return linear_entropy_forward<CpuRows>(hidden, weight, chunk_size);
}

std::tuple<Tensor, Tensor> token_entropy_linear_backward_cpu(Tensor grad_entropy, Tensor hidden,
                                                             Tensor weight, Tensor entropy,
                                                             Tensor logsumexp, int64_t chunk_size) {
  check_entropy_backward_args(grad_entropy, hidden, weight, entropy, logsumexp, chunk_size);
  return linear_entropy_backward<CpuRows>(grad_entropy, hidden, weight, entropy, logsumexp,
                                          chunk_size);
}

}  // namespace nostall
