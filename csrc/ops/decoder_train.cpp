// CPU kernel of decoder_train's forward (see decoder_train.h); the backward is in
// decoder_train_backward.cpp.
#include "ops/decoder_train.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/tensor_utils.h"
#include "ops/decoder_attention.h"
#include "ops/decoder_core.h"
#include "ops/decoder_layout.h"

namespace nostall {

namespace {

using decoder::Layout;
using decoder::rows;
using decoder::Weights;

void add_into(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> decoder_train_cpu(
    Tensor prompt_ids, Tensor prompt_mask, Tensor completion_ids, Tensor completion_mask,
    NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin, int64_t num_heads, int64_t kv_heads,
    double eps) {
  const char* op = "decoder_train";
  const Weights w =
      decoder::check_layers(op, NOSTALL_DECODER_WEIGHTS_GATHER, cos, sin, num_heads, kv_heads, eps);
  const Layout lay =
      decoder::layout(op, prompt_ids, prompt_mask, completion_ids, completion_mask, w);
  const int64_t L = w.layers, N = lay.N, S = lay.capacity, H = w.hidden, Q = w.qkv_width,
                I = w.intermediate;
  const int64_t D = w.head_dim, heads = w.num_heads, kv = w.kv_heads;
  const int64_t A = heads * D, K = lay.K;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  Tensor residuals = new_float(embed, {(2 * L + 1) * S, H});
  Tensor qkv = new_float(embed, {L * S, Q});
  Tensor probs = new_float(embed, {L * S, heads * K});
  Tensor attended = new_float(embed, {L * S, A});
  Tensor gate_up = new_float(embed, {L * S, 2 * I});
  Tensor h = new_float(embed, {N, H});
  Tensor tmp = new_float(embed, {N, H});
  Tensor act = new_float(embed, {N, I});
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  std::vector<float> silu_scratch(static_cast<size_t>(I));

  float* res = residuals.mutable_data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) decoder::embedding_row(w, lay.token[n], res + n * H);
  for (int64_t l = 0; l < L; ++l) {
    const float* xin = res + 2 * l * S * H;
    float* xmid = res + (2 * l + 1) * S * H;
    float* xout = res + (2 * l + 2) * S * H;
    // The last layer runs its attention and MLP on rows [first, N) only: the quiet rows before
    // them give that layer's keys and values and nothing else reads their states. They carry
    // their residual through, and their saved attention and MLP activations are 0.
    const int64_t first = l == L - 1 ? lay.quiet() : 0, M = N - first;
    decoder::rms_norm(h.mutable_data_ptr<float>(), xin, w.input_norm[l].const_data_ptr<float>(), N,
                      H, w.eps);
    Tensor qkv_l = rows(qkv, l * S, N);
    decoder::linear(qkv_l, h, w.qkv_weight[l], w.qkv_bias.empty() ? nullptr : &w.qkv_bias[l]);
    float* qp = qkv_l.mutable_data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t p = lay.position[n];
      for (int64_t head = 0; head < heads + kv; ++head) {
        decoder::rotate(qp + n * Q + head * D, cp + p * D, sp + p * D, D);
      }
    }
    float* probs_l = probs.mutable_data_ptr<float>() + l * S * heads * K;
    float* attended_l = attended.mutable_data_ptr<float>() + l * S * A;
    // Rows on every core: each writes its own probabilities and output (the same sums).
    torch::stable::parallel_for(first, N, 8, [&](int64_t n0, int64_t n1) {
      decoder::attention_forward(qp, lay.key_row.data(), n0, n1, K, Q, heads, kv, D, scale, probs_l,
                                 attended_l);
    });
    Tensor tmp_m = rows(tmp, 0, M), h_m = rows(h, 0, M), act_m = rows(act, 0, M);
    decoder::linear(tmp_m, rows(attended, l * S + first, M), w.o_weight[l], nullptr);
    add_into(xmid + first * H, xin + first * H, tmp.const_data_ptr<float>(), M * H);
    decoder::rms_norm(h.mutable_data_ptr<float>(), xmid + first * H,
                      w.post_norm[l].const_data_ptr<float>(), M, H, w.eps);
    Tensor gate_up_l = rows(gate_up, l * S + first, M);
    decoder::linear(gate_up_l, h_m, w.gate_up_weight[l], nullptr);
    decoder::silu_gate(gate_up_l.const_data_ptr<float>(), act.mutable_data_ptr<float>(), M, I,
                       silu_scratch.data());
    decoder::linear(tmp_m, act_m, w.down_weight[l], nullptr);
    add_into(xout + first * H, xmid + first * H, tmp.const_data_ptr<float>(), M * H);
    if (first > 0) {
      std::memset(probs_l, 0, sizeof(float) * first * heads * K);
      std::memset(attended_l, 0, sizeof(float) * first * A);
      std::memset(gate_up.mutable_data_ptr<float>() + l * S * 2 * I, 0,
                  sizeof(float) * first * 2 * I);
      std::memcpy(xmid, xin, sizeof(float) * first * H);
      std::memcpy(xout, xmid, sizeof(float) * first * H);
    }
  }
  // The rows past N (the prefixes completions shared) hold zeros: the outputs are a function of
  // the inputs alone.
  const auto zero_tail = [&](Tensor& t, int64_t blocks) {
    const int64_t width = t.size(1);
    for (int64_t b = 0; b < blocks; ++b) {
      std::memset(t.mutable_data_ptr<float>() + (b * S + N) * width, 0,
                  sizeof(float) * (S - N) * width);
    }
  };
  if (N < S) {
    zero_tail(residuals, 2 * L + 1);
    zero_tail(qkv, L);
    zero_tail(probs, L);
    zero_tail(attended, L);
    zero_tail(gate_up, L);
  }
  const float* last = res + 2 * L * S * H;
  Tensor hidden = new_float(embed, {lay.B * lay.C, H});
  float* hp = hidden.mutable_data_ptr<float>();
  const float* wn = w.final_norm.const_data_ptr<float>();
  for (int64_t r = 0; r < lay.B; ++r) {
    for (int64_t c = 0; c < lay.C; ++c) {
      decoder::rms_norm(hp + (r * lay.C + c) * H, last + lay.source(r, c) * H, wn, 1, H, w.eps);
    }
  }
  return {hidden, residuals, qkv, probs, attended, gate_up};
}

}  // namespace nostall
