// The native decoder's nine weight arguments, named once: the schema text every decoder op
// declares them with (registration.cpp), the parameters its kernel takes them as, the arguments
// it passes them on as, and the one value they are gathered into. nostall/decoder_weights.py is
// the Python side (DecoderWeights, the same names in the same order), and
// tests/ops/test_decoder_schemas.py checks every decoder op's schema against it. A weight added,
// removed or renamed is an edit here and there, not in seven schemas and eleven kernels.
#pragma once

#include <utility>
#include <vector>

#include "common/checks.h"

// In a schema: `"decode_step(Tensor token, ..., " NOSTALL_DECODER_WEIGHTS_SCHEMA ", ..."`.
#define NOSTALL_DECODER_WEIGHTS_SCHEMA                                                     \
  "Tensor embed, Tensor[] input_norm, Tensor[] qkv_weight, Tensor[] qkv_bias, "            \
  "Tensor[] o_weight, Tensor[] post_norm, Tensor[] gate_up_weight, Tensor[] down_weight, " \
  "Tensor final_norm"

// Their gradients, as decoder_train_backward returns them (the same order).
#define NOSTALL_DECODER_WEIGHT_GRADS_SCHEMA                                   \
  "Tensor grad_embed, Tensor[] grad_input_norm, Tensor[] grad_qkv_weight, "   \
  "Tensor[] grad_qkv_bias, Tensor[] grad_o_weight, Tensor[] grad_post_norm, " \
  "Tensor[] grad_gate_up_weight, Tensor[] grad_down_weight, Tensor grad_final_norm"

// A kernel's parameters for them, in the schema's order.
#define NOSTALL_DECODER_WEIGHTS_PARAMS                                                           \
  Tensor embed, std::vector<Tensor> input_norm, std::vector<Tensor> qkv_weight,                  \
      std::vector<Tensor> qkv_bias, std::vector<Tensor> o_weight, std::vector<Tensor> post_norm, \
      std::vector<Tensor> gate_up_weight, std::vector<Tensor> down_weight, Tensor final_norm

// Passed on to another kernel taking them (copies of the lists: both kernels hold them).
#define NOSTALL_DECODER_WEIGHTS_ARGS                                                         \
  embed, input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight, \
      final_norm

// Gathered into one LayerWeights, the lists moved in (the kernel's own parameters end there).
#define NOSTALL_DECODER_WEIGHTS_GATHER                                                             \
  ::nostall::decoder::LayerWeights {                                                               \
    embed, std::move(input_norm), std::move(qkv_weight), std::move(qkv_bias), std::move(o_weight), \
        std::move(post_norm), std::move(gate_up_weight), std::move(down_weight), final_norm        \
  }

namespace nostall::decoder {

// The weights as a kernel receives them, before any check (decoder_core.h: check_layers).
// Hidden, as the stable ABI's Tensor it holds is: a struct more visible than its fields draws
// -Wattributes (it never crosses the library's boundary).
struct __attribute__((visibility("hidden"))) LayerWeights {
  Tensor embed;
  std::vector<Tensor> input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight,
      down_weight;
  Tensor final_norm;
};

}  // namespace nostall::decoder
