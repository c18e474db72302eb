// CPU kernel of prefill_prompts (see prefill_prompts.h), on the shared layer loop of
// decoder_core.h.
#include "ops/prefill_prompts.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/tensor_utils.h"
#include "ops/decoder_core.h"

namespace nostall {

Tensor prefill_prompts_cpu(Tensor prompt_ids, Tensor prompt_mask, int64_t group_size,
                           NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin,
                           Tensor keys, Tensor values, int64_t num_heads, int64_t kv_heads,
                           double eps) {
  const decoder::Weights w =
      decoder::check("prefill_prompts", NOSTALL_DECODER_WEIGHTS_GATHER, lm_head, cos, sin, keys,
                     values, num_heads, kv_heads, eps);
  STD_TORCH_CHECK(
      prompt_ids.scalar_type() == ScalarType::Long && prompt_ids.dim() == 2 && prompt_ids.is_cpu(),
      "prefill_prompts: prompt_ids must be a CPU int64 [Bp, P]");
  // A group's rows share one prompt, so callers pass every G-th row: a strided view.
  prompt_ids = as_contiguous(prompt_ids);
  const int64_t Bp = prompt_ids.size(0), P = prompt_ids.size(1);
  STD_TORCH_CHECK(Bp >= 1 && P >= 1, "prefill_prompts: prompt_ids must not be empty, got [", Bp,
                  ", ", P, "]");
  STD_TORCH_CHECK(prompt_mask.scalar_type() == ScalarType::Bool && prompt_mask.dim() == 2 &&
                      prompt_mask.size(0) == Bp && prompt_mask.size(1) == P && prompt_mask.is_cpu(),
                  "prefill_prompts: prompt_mask must be a CPU bool [Bp, P] = [", Bp, ", ", P, "]");
  prompt_mask = as_contiguous(prompt_mask);
  STD_TORCH_CHECK(group_size >= 1, "prefill_prompts: group_size must be at least 1, got ",
                  group_size);
  const int64_t G = group_size, S = w.slots, D = w.head_dim, V = w.vocab;
  STD_TORCH_CHECK(w.cache_rows == checked_product(Bp, G, "prefill_prompts", "Bp * group_size"),
                  "prefill_prompts: keys must be [L, Bp * group_size, kv_heads, S, D] with "
                  "Bp * group_size = ",
                  Bp * G, ", got ", w.cache_rows, " rows");
  STD_TORCH_CHECK(P <= S, "prefill_prompts: the cache has ", S, " slots, the prompts ", P,
                  " tokens");
  STD_TORCH_CHECK(P <= cos.size(0), "prefill_prompts: prompts of ", P,
                  " tokens exceed the rotary tables' ", cos.size(0), " positions");
  const int64_t* ids = prompt_ids.const_data_ptr<int64_t>();
  const bool* mask = prompt_mask.const_data_ptr<bool>();
  std::vector<int64_t> pos(static_cast<size_t>(Bp * P));
  for (int64_t b = 0; b < Bp; ++b) {
    STD_TORCH_CHECK(mask[b * P + P - 1], "prefill_prompts: prompt ", b,
                    " must end in a real token (left padding)");
    int64_t count = 0;
    for (int64_t i = 0; i < P; ++i) {
      const int64_t t = ids[b * P + i];
      STD_TORCH_CHECK(t >= 0 && t < V, "prefill_prompts: token ", t, " outside [0, ", V, ")");
      count += mask[b * P + i] ? 1 : 0;
      pos[b * P + i] = count > 0 ? count - 1 : 0;
    }
  }

  const int64_t N = Bp * P;
  Tensor x = new_float(embed, {N, w.hidden});
  decoder::embed_tokens(w, ids, N, x);
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t heads = w.num_heads, kv = w.kv_heads, Q = w.qkv_width, groups = heads / kv;
  float* kc = keys.mutable_data_ptr<float>();
  float* vc = values.mutable_data_ptr<float>();
  // Row r of the cache, head kh: slots [0, S) of D floats each.
  auto cache_at = [&](int64_t l, int64_t r, int64_t kh) {
    return ((l * Bp * G + r) * kv + kh) * S * D;
  };
  decoder::run_layers(w, x, [&](int64_t l, float* qkv, float* att) {
    for (int64_t b = 0; b < Bp; ++b) {
      // Rotate, then write the prompt's keys and values into its group's first row.
      for (int64_t i = 0; i < P; ++i) {
        float* row = qkv + (b * P + i) * Q;
        const int64_t p = pos[b * P + i];
        for (int64_t head = 0; head < heads + kv; ++head) {
          decoder::rotate(row + head * D, cp + p * D, sp + p * D, D);
        }
        for (int64_t kh = 0; kh < kv; ++kh) {
          const int64_t base = cache_at(l, b * G, kh) + i * D;
          std::memcpy(kc + base, row + (heads + kh) * D, sizeof(float) * D);
          std::memcpy(vc + base, row + (heads + kv + kh) * D, sizeof(float) * D);
        }
      }
      // The prompt's positions on every core: each writes its own output (the same sums).
      torch::stable::parallel_for(0, P, 8, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(static_cast<size_t>(P));
        std::vector<char> allowed(static_cast<size_t>(P));
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = 0; j < P; ++j) allowed[j] = (j <= i && mask[b * P + j]) || j == i;
          const float* row = qkv + (b * P + i) * Q;
          for (int64_t head = 0; head < heads; ++head) {
            const int64_t cache = cache_at(l, b * G, head / groups);
            decoder::attend_one(row + head * D, kc + cache, vc + cache, P, D, scale,
                                reinterpret_cast<const bool*>(allowed.data()), scores.data(),
                                att + ((b * P + i) * heads + head) * D);
          }
        }
      });
      // The group's other rows share the prompt's keys and values.
      for (int64_t g = 1; g < G; ++g) {
        for (int64_t kh = 0; kh < kv; ++kh) {
          const int64_t from = cache_at(l, b * G, kh), to = cache_at(l, b * G + g, kh);
          std::memcpy(kc + to, kc + from, sizeof(float) * P * D);
          std::memcpy(vc + to, vc + from, sizeof(float) * P * D);
        }
      }
    }
  });
  // The last prompt token of each prompt predicts its group's first completion token.
  Tensor last = new_float(embed, {Bp, w.hidden});
  const float* xp = x.const_data_ptr<float>();
  float* lp = last.mutable_data_ptr<float>();
  for (int64_t b = 0; b < Bp; ++b) {
    std::memcpy(lp + b * w.hidden, xp + (b * P + P - 1) * w.hidden, sizeof(float) * w.hidden);
  }
  const Tensor prompt_logits = decoder::logits(w, last);
  Tensor out = new_float(embed, {Bp * G, V});
  const float* pl = prompt_logits.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t r = 0; r < Bp * G; ++r) std::memcpy(op + r * V, pl + (r / G) * V, sizeof(float) * V);
  return out;
}

}  // namespace nostall
