// A whole batch of completions in one op: the prefill of each group's prompt, then, per token,
// the sampler (sample_tokens) and a decode step (decode_step), over a static KV cache.
//
// Why native: generation stepped from Python made a dozen op calls and their glue per token,
// holding the GIL between them while the trainer thread beside it waited for the same lock.
// Here the GIL is released for the whole batch (calls through torch.ops release it), and the
// loop checks on the host, at no cost, whether every row has ended (rows that have ended emit
// padding, so stopping then changes no output).
//
// prompt_ids int64, prompt_mask bool [Bp, P] (left-padded), each prompt's group of group_size
// rows; uniform float32 [C, Bp * group_size, V], the sampler's noise for each of the C tokens
// (drawn up front by the caller, so a stopped batch leaves the generator where a full one
// would); allowed bool [V]; the decoder's weights as decode_step takes them; keys, values
// [L, B, kv_heads, S, D] with S >= P + C - 1, written in place. Returns completion_ids int64
// [B, C] (pad_token_id after a row's <eos>), completion_mask bool [B, C] (the sampled tokens,
// <eos> included) and log_prob float32 [B, C] (each token's log-probability under the untruncated
// policy, as sample_tokens records it; 0 where masked). CPU, float32, inference only.
#pragma once

#include <tuple>
#include <vector>

#include "common/checks.h"
#include "ops/decoder_weights.h"

namespace nostall {

std::tuple<Tensor, Tensor, Tensor> generate_completions_cpu(
    Tensor prompt_ids, Tensor prompt_mask, int64_t group_size, Tensor uniform, Tensor allowed,
    NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin, Tensor keys,
    Tensor values, int64_t num_heads, int64_t kv_heads, double eps, double temperature,
    int64_t top_k, double top_p, int64_t eos_token_id, int64_t pad_token_id);

}  // namespace nostall
