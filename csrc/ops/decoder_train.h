// The training forward of a Llama-family decoder (Qwen2, Llama, Mistral) over GRPO's grouped
// batch, and its backward, as two ops.
//
// decoder_train runs Bp left-padded prompts [Bp, P] once each and their B = Bp * G completions
// [B, C] (right-padded; group b's rows are b*G .. b*G+G-1) through every layer in one pass:
// prompt tokens attend causally to their prompt (skipping padding); completion tokens to their
// group's whole prompt (its real tokens) and causally to their own completion. That is the
// tensor-op `Decoder.grouped_hidden`: it returns the final normed hidden states that predict each
// completion token, [B * C, H] (row (r, 0) from the prompt's last token, row (r, c) from
// completion token c - 1), and the activations the backward needs:
//   residuals [(2L + 1) * N, H]  the residual stream entering each layer, after each attention,
//                                and leaving the last layer (N = Bp * P + B * (C - 1) rows: the
//                                prompt tokens but each prompt's last, then the prompts' last
//                                tokens, then each completion's tokens but its last, which
//                                predicts nothing and which no other token attends to)
//   qkv       [L * N, (heads + 2 kv_heads) D]  rotated queries and keys, values
//   probs     [L * N, heads * (P + C - 1)]     attention weights over the query's P prompt
//                                              slots and C - 1 completion slots (0: masked)
//   attended  [L * N, heads * D]               attention outputs
//   gate_up   [L * N, 2 I]                     the MLP's gate and up projections
// The last layer runs its attention and MLP only on the rows whose final state is read (each
// prompt's last token and the completion tokens): the other prompt tokens give it keys and
// values and nothing more, so for them it carries the residual through and saves zeros.
// decoder_train_backward takes the gradient of the hidden states and those activations and
// returns the gradient of every weight (the embedding's through its token rows).
//
// Why native: the update of a small model is about a thousand small tensor ops forward and
// backward (autograd's bookkeeping, broadcasts, reshapes), whose fixed cost is most of its time;
// here the same arithmetic is the GEMMs (through the C shim) and plain loops between them.
// On the CPU, float32 or bf16 weights (decoder_core.h: float32 activations either way, the
// gradients in the weights' dtype); positions count from each prompt's first real token, as in the
// decoder's forward.
#pragma once

#include <tuple>
#include <vector>

#include "common/checks.h"
#include "ops/decoder_weights.h"

namespace nostall {

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> decoder_train_cpu(
    Tensor prompt_ids, Tensor prompt_mask, Tensor completion_ids, Tensor completion_mask,
    NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin, int64_t num_heads, int64_t kv_heads,
    double eps);

std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           Tensor>
decoder_train_backward_cpu(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
                           Tensor completion_ids, Tensor completion_mask,
                           NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin, Tensor residuals,
                           Tensor qkv, Tensor probs, Tensor attended, Tensor gate_up,
                           int64_t num_heads, int64_t kv_heads, double eps);

// decoder_train_backward with every gradient written into flat_grad (the weights' dtype, the
// outputs end to end in their order: what the GRPO update's optimizer holds), set or, with
// accumulate, added into: no gradient tensor is allocated (they are the size of the model).
void decoder_train_backward_into_cpu(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
                                     Tensor completion_ids, Tensor completion_mask,
                                     NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin,
                                     Tensor residuals, Tensor qkv, Tensor probs, Tensor attended,
                                     Tensor gate_up, int64_t num_heads, int64_t kv_heads,
                                     double eps, Tensor flat_grad, bool accumulate);

}  // namespace nostall
