// The prefill of a Llama-family decoder (Qwen2, Llama, Mistral) over a static KV cache, as one
// op: Bp left-padded prompts [Bp, P] run through every layer at once (one GEMM per projection
// over all Bp * P tokens; causal attention that skips padding), their keys and values written
// into cache slots [0, P) of each prompt's G rows (rows b*G .. b*G+G-1: GRPO's groups share a
// prompt, which runs once), and the next-token logits returned for every row, [Bp * G, V].
//
// Positions are counted from each prompt's first real token (0 on padding), as the decoder's
// tensor-op prefill counts them; a padding query attends to itself only, so its (unused) output
// is finite. Why native: at RL prompt batches the tensor-op prefill is about a hundred small ops
// a layer whose fixed cost exceeds their arithmetic. Inference only; on the CPU, float32 or bf16
// weights (decoder_core.h).
#pragma once

#include <vector>

#include "common/checks.h"
#include "ops/decoder_weights.h"

namespace nostall {

Tensor prefill_prompts_cpu(Tensor prompt_ids, Tensor prompt_mask, int64_t group_size,
                           NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin,
                           Tensor keys, Tensor values, int64_t num_heads, int64_t kv_heads,
                           double eps);

}  // namespace nostall
