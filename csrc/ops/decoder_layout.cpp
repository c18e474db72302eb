// The row layout of decoder_train's batch (decoder_layout.h).
#include "ops/decoder_layout.h"

#include <cstring>
#include <unordered_map>

#include "common/tensor_utils.h"

namespace nostall::decoder {

Tensor rows(const Tensor& t, int64_t start, int64_t count) {
  const int64_t cols = t.size(1);
  const int64_t sizes[2] = {count, cols};
  const int64_t strides[2] = {cols, 1};
  AtenTensorHandle out = nullptr;
  STD_TORCH_CHECK(aoti_torch__reinterpret_tensor(t.get(), 2, sizes, strides, start * cols, &out) ==
                      AOTI_TORCH_SUCCESS,
                  "decoder_train: could not make a row view");
  return Tensor(out);
}

Tensor zeros(const Tensor& like, int64_t r, int64_t c) {
  Tensor t = new_float(like, {r, c});
  std::memset(t.mutable_data_ptr<float>(), 0, sizeof(float) * static_cast<size_t>(r * c));
  return t;
}

Tensor zeros(const Tensor& like, int64_t n) {
  Tensor t = new_float(like, {n});
  std::memset(t.mutable_data_ptr<float>(), 0, sizeof(float) * static_cast<size_t>(n));
  return t;
}

Layout layout(const char* op, Tensor& prompt_ids, Tensor& prompt_mask, Tensor& completion_ids,
              Tensor& completion_mask, const Weights& w) {
  STD_TORCH_CHECK(
      prompt_ids.scalar_type() == ScalarType::Long && prompt_ids.dim() == 2 && prompt_ids.is_cpu(),
      op, ": prompt_ids must be a CPU int64 [Bp, P]");
  STD_TORCH_CHECK(completion_ids.scalar_type() == ScalarType::Long && completion_ids.dim() == 2 &&
                      completion_ids.is_cpu(),
                  op, ": completion_ids must be a CPU int64 [B, C]");
  // A group's rows share one prompt, so callers pass every G-th row: a strided view.
  prompt_ids = as_contiguous(prompt_ids);
  completion_ids = as_contiguous(completion_ids);
  Layout lay;
  lay.Bp = prompt_ids.size(0);
  lay.P = prompt_ids.size(1);
  lay.B = completion_ids.size(0);
  lay.C = completion_ids.size(1);
  STD_TORCH_CHECK(lay.Bp >= 1 && lay.P >= 1, op, ": prompt_ids must not be empty, got [", lay.Bp,
                  ", ", lay.P, "]");
  STD_TORCH_CHECK(lay.C >= 1 && lay.B >= lay.Bp && lay.B % lay.Bp == 0, op,
                  ": completion_ids must be [Bp * G, C] with Bp = ", lay.Bp, " and C >= 1, got [",
                  lay.B, ", ", lay.C, "]");
  STD_TORCH_CHECK(prompt_mask.scalar_type() == ScalarType::Bool && prompt_mask.dim() == 2 &&
                      prompt_mask.size(0) == lay.Bp && prompt_mask.size(1) == lay.P &&
                      prompt_mask.is_cpu(),
                  op, ": prompt_mask must be a CPU bool [Bp, P] = [", lay.Bp, ", ", lay.P, "]");
  STD_TORCH_CHECK(completion_mask.scalar_type() == ScalarType::Bool && completion_mask.dim() == 2 &&
                      completion_mask.size(0) == lay.B && completion_mask.size(1) == lay.C &&
                      completion_mask.is_cpu(),
                  op, ": completion_mask must be a CPU bool [B, C] = [", lay.B, ", ", lay.C, "]");
  prompt_mask = as_contiguous(prompt_mask);
  completion_mask = as_contiguous(completion_mask);
  const int64_t Bp = lay.Bp, P = lay.P, B = lay.B, C = lay.C, R = C - 1, K = P + R, V = w.vocab;
  lay.G = B / Bp;
  lay.Np = Bp * P;
  lay.capacity = lay.Np + B * R;
  lay.K = K;
  const int64_t S = lay.capacity, positions = w.cos.size(0);
  lay.token.resize(static_cast<size_t>(S));
  lay.position.resize(static_cast<size_t>(S));
  lay.key_row.assign(static_cast<size_t>(S * K), -1);
  const int64_t* pid = prompt_ids.const_data_ptr<int64_t>();
  const int64_t* cid = completion_ids.const_data_ptr<int64_t>();
  const bool* pm = prompt_mask.const_data_ptr<bool>();
  const bool* cm = completion_mask.const_data_ptr<bool>();
  // Each completion token's row: a new one for a prefix not seen in its group, keyed by the
  // parent's row (or the group, for a first token), the token and its mask bit.
  lay.completion_row.resize(static_cast<size_t>(B * R));
  std::unordered_map<uint64_t, int64_t> rows_of;
  int64_t next = lay.Np;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t c = 0; c < R; ++c) {
      const int64_t t = cid[r * C + c];
      STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
      const uint64_t parent = c == 0 ? static_cast<uint64_t>(r / lay.G)
                                     : static_cast<uint64_t>(lay.completion_row[r * R + c - 1]);
      const uint64_t key =
          ((parent * static_cast<uint64_t>(V) + static_cast<uint64_t>(t)) << 1) | cm[r * C + c];
      const auto [it, added] = rows_of.try_emplace(key, next);
      lay.completion_row[r * R + c] = it->second;
      next += added ? 1 : 0;
    }
  }
  lay.N = next;
  for (int64_t b = 0; b < Bp; ++b) {
    for (int64_t i = 0; i < P; ++i) {
      const int64_t t = pid[b * P + i];
      STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
      lay.token[lay.prompt_row(b, i)] = t;
    }
  }
  for (int64_t r = 0; r < B; ++r) {  // (the last token, not run, is checked too)
    const int64_t t = cid[r * C + C - 1];
    STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
  }
  for (int64_t b = 0; b < Bp; ++b) {
    STD_TORCH_CHECK(pm[b * P + P - 1], op, ": prompt ", b,
                    " must end in a real token (left padding)");
    int64_t count = 0;
    for (int64_t i = 0; i < P; ++i) {
      const int64_t n = lay.prompt_row(b, i);
      count += pm[b * P + i] ? 1 : 0;
      lay.position[n] = count > 0 ? count - 1 : 0;
      for (int64_t j = 0; j < P; ++j) {
        if ((j <= i && pm[b * P + j]) || j == i) lay.key_row[n * K + j] = lay.prompt_row(b, j);
      }
    }
  }
  for (int64_t r = 0; r < B; ++r) {
    const int64_t b = r / lay.G, last = lay.position[lay.prompt_row(b, P - 1)];
    int64_t count = 0;
    for (int64_t c = 0; c < R; ++c) {
      const int64_t n = lay.completion_row[r * R + c];  // (a shared row: written alike again)
      lay.token[n] = cid[r * C + c];
      count += cm[r * C + c] ? 1 : 0;
      lay.position[n] = last + (count > 0 ? count : 1);
      STD_TORCH_CHECK(lay.position[n] < positions, op, ": position ", lay.position[n],
                      " exceeds the rotary tables' ", positions, " positions");
      for (int64_t j = 0; j < P; ++j) {
        if (pm[b * P + j]) lay.key_row[n * K + j] = lay.prompt_row(b, j);
      }
      for (int64_t j = 0; j <= c; ++j) {
        if (cm[r * C + j] || j == c) lay.key_row[n * K + P + j] = lay.completion_row[r * R + j];
      }
    }
  }
  return lay;
}

}  // namespace nostall::decoder
