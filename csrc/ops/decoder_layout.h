// What decoder_train and its backward share (decoder_train.h): the batch's row layout, worked
// out from the token ids and masks alike by both, and row views and zeroed float32 buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "common/checks.h"
#include "ops/decoder_core.h"

namespace nostall::decoder {

// Rows [start, start + count) of a contiguous 2-D tensor, as a view.
Tensor rows(const Tensor& t, int64_t start, int64_t count);

// A zeroed float32 [r, c] / [n] on like's device.
Tensor zeros(const Tensor& like, int64_t r, int64_t c);
Tensor zeros(const Tensor& like, int64_t n);

// The batch's shape and, for each of the N token rows run, its token, its position and the row
// of the key behind each of its K = P + C - 1 attention slots (-1: masked).
// - A completion's last token predicts nothing and no other token attends to it: not run.
// - Completions of one group that begin alike share the rows of their common beginning (a row's
//   state depends only on its prompt and the tokens and mask up to it): one row per distinct
//   prefix, the tree a group's completions make. Late in training most of a group's
//   completions agree (about a quarter of the race's completion rows are shared on average),
//   and each shared row is computed once; its gradient is the sum over the completions that
//   read it, as the final norm's backward adds into it.
// - The rows: first every prompt's tokens but its last (`quiet` rows: read by the last layer
//   only as keys and values, so that layer's attention and MLP skip them), then each prompt's
//   last token, then the distinct completion prefixes. N <= capacity = Bp * P + B * (C - 1),
//   the rows the saved activations hold (their shapes do not depend on the data); rows past N
//   are zeros.
struct Layout {
  int64_t Bp = 0, P = 0, B = 0, C = 0, G = 0, N = 0, Np = 0, K = 0, capacity = 0;
  std::vector<int64_t> token, position, key_row;
  std::vector<int64_t> completion_row;   // [B, C - 1]: the row of each completion token run
  int64_t run() const { return C - 1; }  // completion tokens run per row
  int64_t quiet() const { return Bp * (P - 1); }
  // The row of prompt b's token i.
  int64_t prompt_row(int64_t b, int64_t i) const {
    return i == P - 1 ? quiet() + b : b * (P - 1) + i;
  }
  // The row whose final state predicts completion token (r, c).
  int64_t source(int64_t r, int64_t c) const {
    return c == 0 ? prompt_row(r / G, P - 1) : completion_row[r * run() + c - 1];
  }
};

// The layout of a batch, its ids and masks checked (and made contiguous, in place).
Layout layout(const char* op, Tensor& prompt_ids, Tensor& prompt_mask, Tensor& completion_ids,
              Tensor& completion_mask, const Weights& w);

}  // namespace nostall::decoder
