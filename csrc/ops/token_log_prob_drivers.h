// The drivers of token_log_prob, its linear variant and token_entropy_linear, shared by the CPU
// and CUDA kernels: they shape the tensors into flat rows and, for the linear ops, walk the
// chunks (matrix
// products through torch: BLAS / cuBLAS); the row kernels are the backend's own (`Rows`).
// Argument checks, device guards and the CPU's token range check stay with the callers.
//
// `Rows` provides, over flat contiguous rows (logits [M, V]; tokens, log_prob, logsumexp,
// grad_log_prob [M]):
//   forward(logits, tokens, log_prob, logsumexp)
//   backward(grad_log_prob, logits, tokens, logsumexp, grad_logits)  (grad_logits may be logits)
//   entropy_forward(logits, entropy, logsumexp)
//   entropy_backward(grad_entropy, logits, entropy, logsumexp, grad_logits)  (the same aliasing)
//   mm_into(out, a, b)                            (out = a @ b, out a view)
//   accumulate_product(acc, a, b)                 (acc += a @ b, acc float32/64)
#pragma once

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <tuple>

#include "common/tensor_utils.h"
#include "ops/token_log_prob.h"

namespace nostall {

template <typename Rows>
std::tuple<Tensor, Tensor> logits_log_prob_forward(Tensor logits, Tensor tokens) {
  using namespace torch::stable;
  const int64_t M = logits.size(0) * logits.size(1);
  const int64_t V = logits.size(2);
  Tensor log_prob = new_row_values(logits);
  Tensor logsumexp = new_row_values(logits);
  Tensor lp = reshape(log_prob, {M});
  Tensor lse = reshape(logsumexp, {M});
  Rows::forward(reshape(as_contiguous(logits), {M, V}), reshape(as_contiguous(tokens), {M}), lp,
                lse);
  return {log_prob, logsumexp};
}

template <typename Rows>
Tensor logits_log_prob_backward(Tensor grad_log_prob, Tensor logits, Tensor tokens,
                                Tensor logsumexp) {
  using namespace torch::stable;
  const int64_t M = logits.size(0) * logits.size(1);
  const int64_t V = logits.size(2);
  logits = as_contiguous(logits);
  Tensor grad_logits = empty_like(logits);
  Tensor flat_grad = reshape(grad_logits, {M, V});
  Rows::backward(reshape(as_contiguous(grad_log_prob), {M}), reshape(logits, {M, V}),
                 reshape(as_contiguous(tokens), {M}), reshape(as_contiguous(logsumexp), {M}),
                 flat_grad);
  return grad_logits;
}

// Calls step(logits, m0, rows) for each chunk of the rows of h [M, H], with logits =
// h[m0 : m0 + rows] @ weight^T: the only [rows, V] buffer, dropped before the next chunk's.
template <typename Step>
void for_each_logits_chunk(Tensor h, const Tensor& weight, int64_t chunk_size, Step step) {
  using namespace torch::stable;
  const int64_t M = h.size(0);
  const Tensor weight_t = transpose(weight, 0, 1);
  for (int64_t m0 = 0; m0 < M; m0 += chunk_size) {
    const int64_t rows = std::min(chunk_size, M - m0);
    Tensor logits = matmul(narrow(h, 0, m0, rows), weight_t);
    step(logits, m0, rows);
  }
}

// The backward of a per-row function of the logits hidden @ weight^T: each chunk's logits are
// recomputed and overwritten in place by row_grad(logits, m0, rows) with the output's gradient
// with respect to them (still one [rows, V] buffer), then multiplied back into the gradients of
// hidden and weight.
template <typename Rows, typename RowGrad>
std::tuple<Tensor, Tensor> linear_rows_backward(Tensor hidden, Tensor weight, int64_t chunk_size,
                                                RowGrad row_grad) {
  using namespace torch::stable;
  const int64_t H = hidden.size(2);
  const int64_t M = hidden.size(0) * hidden.size(1);
  Tensor h = reshape(as_contiguous(hidden), {M, H});
  Tensor grad_hidden = new_empty(hidden, {M, H});
  // grad_weight sums one product per chunk: accumulate in float32 (float64 for float64).
  Tensor grad_weight_acc =
      new_zeros(weight, {weight.size(0), H}, accumulation_dtype(weight.scalar_type()));
  for_each_logits_chunk(h, weight, chunk_size, [&](Tensor& logits, int64_t m0, int64_t rows) {
    row_grad(logits, m0, rows);
    Tensor grad_hidden_rows = narrow(grad_hidden, 0, m0, rows);
    Rows::mm_into(grad_hidden_rows, logits, weight);
    Rows::accumulate_product(grad_weight_acc, transpose(logits, 0, 1), narrow(h, 0, m0, rows));
  });
  Tensor grad_weight = grad_weight_acc.scalar_type() == weight.scalar_type()
                           ? grad_weight_acc
                           : to(grad_weight_acc, weight.scalar_type());
  return {reshape(grad_hidden, {hidden.size(0), hidden.size(1), H}), grad_weight};
}

template <typename Rows>
std::tuple<Tensor, Tensor> linear_log_prob_forward(Tensor hidden, Tensor weight, Tensor tokens,
                                                   int64_t chunk_size) {
  using namespace torch::stable;
  const int64_t H = hidden.size(2);
  const int64_t M = hidden.size(0) * hidden.size(1);
  Tensor log_prob = new_row_values(hidden);
  Tensor logsumexp = new_row_values(hidden);
  Tensor tok = reshape(as_contiguous(tokens), {M});
  Tensor lp = reshape(log_prob, {M});
  Tensor lse = reshape(logsumexp, {M});
  for_each_logits_chunk(reshape(as_contiguous(hidden), {M, H}), weight, chunk_size,
                        [&](Tensor& logits, int64_t m0, int64_t rows) {
                          Tensor lp_rows = narrow(lp, 0, m0, rows);
                          Tensor lse_rows = narrow(lse, 0, m0, rows);
                          Rows::forward(logits, narrow(tok, 0, m0, rows), lp_rows, lse_rows);
                        });
  return {log_prob, logsumexp};
}

template <typename Rows>
std::tuple<Tensor, Tensor> linear_log_prob_backward(Tensor grad_log_prob, Tensor hidden,
                                                    Tensor weight, Tensor tokens, Tensor logsumexp,
                                                    int64_t chunk_size) {
  using namespace torch::stable;
  const int64_t M = hidden.size(0) * hidden.size(1);
  Tensor tok = reshape(as_contiguous(tokens), {M});
  Tensor g = reshape(as_contiguous(grad_log_prob), {M});
  Tensor lse = reshape(as_contiguous(logsumexp), {M});
  return linear_rows_backward<Rows>(
      hidden, weight, chunk_size, [&](Tensor& logits, int64_t m0, int64_t rows) {
        Rows::backward(narrow(g, 0, m0, rows), logits, narrow(tok, 0, m0, rows),
                       narrow(lse, 0, m0, rows), logits);
      });
}

template <typename Rows>
std::tuple<Tensor, Tensor> linear_entropy_forward(Tensor hidden, Tensor weight,
                                                  int64_t chunk_size) {
  using namespace torch::stable;
  const int64_t H = hidden.size(2);
  const int64_t M = hidden.size(0) * hidden.size(1);
  Tensor entropy = new_row_values(hidden);
  Tensor logsumexp = new_row_values(hidden);
  Tensor ent = reshape(entropy, {M});
  Tensor lse = reshape(logsumexp, {M});
  for_each_logits_chunk(reshape(as_contiguous(hidden), {M, H}), weight, chunk_size,
                        [&](Tensor& logits, int64_t m0, int64_t rows) {
                          Tensor ent_rows = narrow(ent, 0, m0, rows);
                          Tensor lse_rows = narrow(lse, 0, m0, rows);
                          Rows::entropy_forward(logits, ent_rows, lse_rows);
                        });
  return {entropy, logsumexp};
}

template <typename Rows>
std::tuple<Tensor, Tensor> linear_entropy_backward(Tensor grad_entropy, Tensor hidden,
                                                   Tensor weight, Tensor entropy, Tensor logsumexp,
                                                   int64_t chunk_size) {
  using namespace torch::stable;
  const int64_t M = hidden.size(0) * hidden.size(1);
  Tensor g = reshape(as_contiguous(grad_entropy), {M});
  Tensor ent = reshape(as_contiguous(entropy), {M});
  Tensor lse = reshape(as_contiguous(logsumexp), {M});
  return linear_rows_backward<Rows>(
      hidden, weight, chunk_size, [&](Tensor& logits, int64_t m0, int64_t rows) {
        Rows::entropy_backward(narrow(g, 0, m0, rows), logits, narrow(ent, 0, m0, rows),
                               narrow(lse, 0, m0, rows), logits);
      });
}

}  // namespace nostall
