// CPU kernel of generate_completions (see generate_completions.h): the prefill, then the
// sampler and a decode step per token, as the Python loop of nostall/lm/generation.py runs them.
#include "ops/generate_completions.h"

#include <torch/csrc/stable/ops.h>

#include <cstring>

#include "common/tensor_utils.h"
#include "ops/decode_step.h"
#include "ops/prefill_prompts.h"
#include "ops/sample_tokens.h"

namespace nostall {

std::tuple<Tensor, Tensor, Tensor> generate_completions_cpu(
    Tensor prompt_ids, Tensor prompt_mask, int64_t group_size, Tensor uniform, Tensor allowed,
    NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin, Tensor keys,
    Tensor values, int64_t num_heads, int64_t kv_heads, double eps, double temperature,
    int64_t top_k, double top_p, int64_t eos_token_id, int64_t pad_token_id) {
  const char* op = "generate_completions";
  STD_TORCH_CHECK(
      prompt_ids.scalar_type() == ScalarType::Long && prompt_ids.dim() == 2 && prompt_ids.is_cpu(),
      op, ": prompt_ids must be a CPU int64 [Bp, P]");
  STD_TORCH_CHECK(group_size >= 1, op, ": group_size must be at least 1, got ", group_size);
  const int64_t Bp = prompt_ids.size(0), P = prompt_ids.size(1);
  const int64_t B = checked_product(Bp, group_size, op, "Bp * group_size");
  STD_TORCH_CHECK(prompt_mask.scalar_type() == ScalarType::Bool && prompt_mask.dim() == 2 &&
                      prompt_mask.size(0) == Bp && prompt_mask.size(1) == P && prompt_mask.is_cpu(),
                  op, ": prompt_mask must be a CPU bool [Bp, P] = [", Bp, ", ", P, "]");
  STD_TORCH_CHECK(uniform.scalar_type() == ScalarType::Float && uniform.dim() == 3 &&
                      uniform.size(0) >= 1 && uniform.size(1) == B && uniform.is_cpu(),
                  op, ": uniform must be a CPU float32 [C, B, V] with C >= 1 and B = ", B);
  const int64_t C = uniform.size(0);
  STD_TORCH_CHECK(keys.dim() == 5 && keys.size(1) == B, op,
                  ": keys must be [L, B, kv_heads, S, D] with B = ", B);
  const int64_t S = keys.size(3);
  STD_TORCH_CHECK(S >= P + C - 1, op, ": the cache's ", S, " slots cannot hold ", P,
                  " prompt tokens and ", C - 1, " decoded ones");
  uniform = as_contiguous(uniform);
  prompt_mask = as_contiguous(prompt_mask);

  Tensor logits =
      prefill_prompts_cpu(prompt_ids, prompt_mask, group_size, NOSTALL_DECODER_WEIGHTS_ARGS,
                          lm_head, cos, sin, keys, values, num_heads, kv_heads, eps);
  // Each row's attention slots (its prompt's real tokens, then each token decoded) and the
  // position of its first completion token.
  Tensor slot_mask = torch::stable::new_empty(prompt_mask, {B, S});
  Tensor position = torch::stable::new_empty(prompt_ids, {B});
  Tensor slot = torch::stable::new_empty(prompt_ids, {1});
  Tensor finished = torch::stable::new_empty(prompt_mask, {B});
  bool* sm = slot_mask.mutable_data_ptr<bool>();
  int64_t* pos = position.mutable_data_ptr<int64_t>();
  bool* done = finished.mutable_data_ptr<bool>();
  const bool* pm = prompt_mask.const_data_ptr<bool>();
  std::vector<int64_t> first(static_cast<size_t>(B));
  std::memset(sm, 0, sizeof(bool) * static_cast<size_t>(B * S));
  for (int64_t r = 0; r < B; ++r) {
    const bool* row = pm + (r / group_size) * P;
    int64_t real = 0;
    for (int64_t j = 0; j < P; ++j) {
      sm[r * S + j] = row[j];
      real += row[j] ? 1 : 0;
    }
    first[r] = real;
    done[r] = false;
  }

  Tensor ids = torch::stable::new_empty(prompt_ids, {B, C});
  Tensor mask = torch::stable::new_empty(prompt_mask, {B, C});
  Tensor log_prob = torch::stable::new_empty(uniform, {B, C});
  int64_t* idp = ids.mutable_data_ptr<int64_t>();
  bool* mp = mask.mutable_data_ptr<bool>();
  float* lp = log_prob.mutable_data_ptr<float>();
  for (int64_t i = 0; i < B * C; ++i) {
    idp[i] = pad_token_id;
    mp[i] = false;
    lp[i] = 0.0f;
  }
  for (int64_t t = 0; t < C; ++t) {
    for (int64_t r = 0; r < B; ++r) mp[r * C + t] = !done[r];
    auto [token, token_log_prob] =
        sample_tokens_cpu(logits, select_first(uniform, t), finished, allowed, temperature, top_k,
                          top_p, eos_token_id, pad_token_id);
    const int64_t* tp = token.const_data_ptr<int64_t>();
    const float* tlp = token_log_prob.const_data_ptr<float>();
    bool all_done = true;
    for (int64_t r = 0; r < B; ++r) {
      idp[r * C + t] = tp[r];
      lp[r * C + t] = tlp[r];
      all_done = all_done && done[r];
    }
    // Rows that have ended emit padding from here on: the rest of the outputs are as filled.
    if (t == C - 1 || all_done) break;
    for (int64_t r = 0; r < B; ++r) {
      sm[r * S + P + t] = true;
      pos[r] = first[r] + t;
    }
    slot.mutable_data_ptr<int64_t>()[0] = P + t;
    logits = decode_step_cpu(token, position, slot, slot_mask, NOSTALL_DECODER_WEIGHTS_ARGS,
                             lm_head, cos, sin, keys, values, num_heads, kv_heads, eps);
  }
  return {ids, mask, log_prob};
}

}  // namespace nostall
