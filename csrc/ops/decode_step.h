// One decode step of a Llama-family decoder (Qwen2, Llama, Mistral) over a static KV cache, as
// one op: for B sequences, each at its own position, embed the token, run every layer (RMSNorm,
// fused q/k/v projection with optional bias, rotary embedding, the new key and value written at
// cache slot `slot` (one for every row, or [B]: each row's own, for rows at their own lengths),
// grouped-query attention over the slots slot_mask allows, output
// projection, RMSNorm, fused gate/up projection, SiLU-gated MLP), the final RMSNorm and the
// output projection:  logits [B, V].
//
// Why: a decode step of a small model is a few hundred tiny tensor ops from Python, and at
// generation batch sizes their fixed cost is most of the step. Inference only (no autograd);
// on the CPU, float32 or bf16 weights (decoder_core.h). On a GPU the same step in Python is
// captured as a CUDA graph instead.
//
// Rotary: q' = q * cos[pos] + roll(q, D/2) * sin[pos], with sin's first half negated (so the
// roll is transformers' rotate_half). Weights are in nn.Linear's layout [out, in].
#pragma once

#include <vector>

#include "common/checks.h"
#include "ops/decoder_weights.h"

namespace nostall {

Tensor decode_step_cpu(Tensor token, Tensor position, Tensor slot, Tensor slot_mask,
                       NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor lm_head, Tensor cos, Tensor sin,
                       Tensor keys, Tensor values, int64_t num_heads, int64_t kv_heads, double eps);

}  // namespace nostall
