// CPU kernel of decode_step (see decode_step.h), on the shared layer loop of decoder_core.h.
#include "ops/decode_step.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <vector>

#include "common/tensor_utils.h"
#include "ops/decoder_core.h"

namespace nostall {

Tensor decode_step_cpu(Tensor token, Tensor position, Tensor slot, Tensor slot_mask,
                       NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin,
                       Tensor keys, Tensor values, int64_t num_heads, int64_t kv_heads,
                       double eps) {
  const decoder::Weights w = decoder::check("decode_step", NOSTALL_DECODER_WEIGHTS_GATHER, lm_head,
                                            cos, sin, keys, values, num_heads, kv_heads, eps);
  STD_TORCH_CHECK(token.scalar_type() == ScalarType::Long && token.dim() == 1,
                  "decode_step: token must be int64 [B]");
  const int64_t B = token.size(0);
  STD_TORCH_CHECK(
      position.scalar_type() == ScalarType::Long && position.dim() == 1 && position.size(0) == B,
      "decode_step: position must be int64 [B]");
  STD_TORCH_CHECK(slot.scalar_type() == ScalarType::Long && slot.dim() <= 1 &&
                      (slot.numel() == 1 || slot.numel() == B) && slot.is_contiguous(),
                  "decode_step: slot must be a one-element int64 tensor (every row's slot) or "
                  "int64 [B] (each row's own)");
  STD_TORCH_CHECK(token.is_cpu() && position.is_cpu() && slot.is_cpu() && slot_mask.is_cpu(),
                  "decode_step: token, position, slot and slot_mask must be CPU tensors");
  STD_TORCH_CHECK(w.cache_rows == B,
                  "decode_step: keys must be [L, B, kv_heads, S, D] with B = ", B);
  const int64_t S = w.slots, D = w.head_dim, V = w.vocab;
  STD_TORCH_CHECK(slot_mask.scalar_type() == ScalarType::Bool && slot_mask.dim() == 2 &&
                      slot_mask.size(0) == B && slot_mask.size(1) == S && slot_mask.is_contiguous(),
                  "decode_step: slot_mask must be a contiguous bool [B, S] = [", B, ", ", S, "]");
  // A CPU tensor: no device read. One slot for every row (a batch decoded in step), or a slot
  // a row (rows at their own lengths: an episode's cache kept across its turns).
  const int64_t* slots = slot.const_data_ptr<int64_t>();
  const int64_t slot_stride = slot.numel() == 1 ? 0 : 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = slots[b * slot_stride];
    STD_TORCH_CHECK(s >= 0 && s < S, "decode_step: slot ", s, " outside [0, ", S, ")");
  }
  const int64_t* tok = token.const_data_ptr<int64_t>();
  const int64_t* pos = position.const_data_ptr<int64_t>();
  const int64_t P = cos.size(0);
  for (int64_t b = 0; b < B; ++b) {
    STD_TORCH_CHECK(tok[b] >= 0 && tok[b] < V, "decode_step: token ", tok[b], " outside [0, ", V,
                    ")");
    STD_TORCH_CHECK(pos[b] >= 0 && pos[b] < P, "decode_step: position ", pos[b], " outside [0, ", P,
                    ")");
  }

  Tensor x = new_float(embed, {B, w.hidden});
  decoder::embed_tokens(w, tok, B, x);
  const bool* mask = slot_mask.const_data_ptr<bool>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t heads = w.num_heads, kv = w.kv_heads, Q = w.qkv_width, groups = heads / kv;
  float* kc = keys.mutable_data_ptr<float>();
  float* vc = values.mutable_data_ptr<float>();
  decoder::run_layers(w, x, [&](int64_t l, float* qkv, float* att) {
    // Rows on every core: each row's rotation, cache writes and attention touch that row's
    // memory alone, each sum in the order one thread would take (the same results). The
    // attention reads the row's whole cache: past a few hundred slots it is most of a step.
    torch::stable::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> scores(static_cast<size_t>(S));
      for (int64_t b = b0; b < b1; ++b) {
        float* row = qkv + b * Q;
        for (int64_t head = 0; head < heads + kv; ++head) {
          decoder::rotate(row + head * D, cp + pos[b] * D, sp + pos[b] * D, D);
        }
        // The new key and value into the cache at the row's slot.
        const int64_t s = slots[b * slot_stride];
        for (int64_t kh = 0; kh < kv; ++kh) {
          const int64_t base = (((l * B + b) * kv + kh) * S + s) * D;
          for (int64_t d = 0; d < D; ++d) {
            kc[base + d] = row[(heads + kh) * D + d];
            vc[base + d] = row[(heads + kv + kh) * D + d];
          }
        }
        for (int64_t head = 0; head < heads; ++head) {
          const int64_t cache = ((l * B + b) * kv + head / groups) * S * D;
          decoder::attend_one(row + head * D, kc + cache, vc + cache, S, D, scale, mask + b * S,
                              scores.data(), att + (b * heads + head) * D);
        }
      }
    });
  });
  return decoder::logits(w, x);
}

}  // namespace nostall
