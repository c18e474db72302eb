// CPU kernel of decoder_train_backward (see decoder_train.h): the forward's adjoints, layer by
// layer from the last, over the activations the forward saved.
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "common/tensor_utils.h"
#include "ops/decoder_attention.h"
#include "ops/decoder_core.h"
#include "ops/decoder_layout.h"
#include "ops/decoder_train.h"

namespace nostall {

namespace {

using decoder::Layout;
using decoder::rows;
using decoder::Weights;
using decoder::zeros;

// dx += d rms_norm(x; weight) / dx . dy, and grad_weight += dy * x / rms(x), row by row;
// wdy [H] scratch (the final norm calls this once per completion token: no allocation per call).
NOSTALL_AVX2_CLONES void rms_norm_backward(const float* dy, const float* x, const float* weight,
                                           int64_t N, int64_t H, float eps, float* __restrict dx,
                                           float* __restrict grad_weight, float* __restrict wdy) {
  for (int64_t b = 0; b < N; ++b) {
    const float* xb = x + b * H;
    const float* db = dy + b * H;
    for (int64_t j = 0; j < H; ++j) wdy[j] = weight[j] * db[j];
    const float r = 1.0f / std::sqrt(decoder::dot(xb, xb, H) / static_cast<float>(H) + eps);
    const float coef = r * r * r * decoder::dot(wdy, xb, H) / static_cast<float>(H);
    for (int64_t j = 0; j < H; ++j) {
      dx[b * H + j] += r * wdy[j] - coef * xb[j];
      grad_weight[j] += db[j] * xb[j] * r;
    }
  }
}

// d(silu(gate) * up) for gate_up [N, 2I] and the gradient of the product, dact [N, I], into
// dgate_up [N, 2I]; act [N, I] gets silu(gate) * up (the down projection's input). The
// exponentials go through scratch [I] in a loop of their own, so both loops vectorize.
NOSTALL_AVX2_CLONES void silu_gate_backward(const float* __restrict gate_up,
                                            const float* __restrict dact, int64_t N, int64_t I,
                                            float* __restrict dgate_up, float* __restrict act,
                                            float* __restrict scratch) {
  for (int64_t b = 0; b < N; ++b) {
    const float* __restrict gate = gate_up + b * 2 * I;
    const float* __restrict up = gate + I;
    const float* __restrict d = dact + b * I;
    float* __restrict dg = dgate_up + b * 2 * I;
    float* __restrict du = dg + I;
    float* __restrict a = act + b * I;
    for (int64_t i = 0; i < I; ++i) scratch[i] = decoder::fast_exp(-gate[i]);
    for (int64_t i = 0; i < I; ++i) {
      const float s = 1.0f / (1.0f + scratch[i]);
      const float silu = gate[i] * s;
      a[i] = silu * up[i];
      du[i] = d[i] * silu;
      dg[i] = d[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
    }
  }
}

// One head's gradient g [D], taken back in place through the rotation y = x * cos +
// roll(x, D/2) * signed sin: its transpose, dx[e] = dy[e] cos[e] + dy[e'] sin[e'] with
// e' = (e + D/2) mod D, pair by pair.
inline void unrotate_grad(float* __restrict g, const float* __restrict cos,
                          const float* __restrict sin, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t e = 0; e < half; ++e) {
    const float a = g[e], b = g[e + half];
    g[e] = a * cos[e] + b * sin[e + half];
    g[e + half] = b * cos[e + half] + a * sin[e];
  }
}

// The embedding's gradient [V, H] in its dtype: each run row's dx [N, H] added into its token's
// row. bf16 sums each token's rows in float32 first and rounds once (the rows of a token the
// batch repeats would each lose bits otherwise).
Tensor embedding_gradient(const Tensor& embed, const Layout& lay, const float* dx, int64_t H) {
  const int64_t V = embed.size(0);
  if (embed.scalar_type() == ScalarType::Float) {
    Tensor g = zeros(embed, V, H);
    float* ge = g.mutable_data_ptr<float>();
    for (int64_t n = 0; n < lay.N; ++n) decoder::axpy(ge + lay.token[n] * H, 1.0f, dx + n * H, H);
    return g;
  }
  std::unordered_map<int64_t, int64_t> slot_of;
  std::vector<float> sums;
  for (int64_t n = 0; n < lay.N; ++n) {
    const auto [it, added] =
        slot_of.try_emplace(lay.token[n], static_cast<int64_t>(slot_of.size()));
    if (added) sums.resize(sums.size() + static_cast<size_t>(H), 0.0f);
    decoder::axpy(sums.data() + it->second * H, 1.0f, dx + n * H, H);
  }
  Tensor g = new_contiguous(embed, {V, H});
  auto* ge = static_cast<uint16_t*>(g.mutable_data_ptr());
  std::memset(ge, 0, sizeof(uint16_t) * static_cast<size_t>(V * H));
  for (const auto& [token, slot] : slot_of) {
    for (int64_t j = 0; j < H; ++j) ge[token * H + j] = decoder::narrow_bf16(sums[slot * H + j]);
  }
  return g;
}

}  // namespace

std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           Tensor>
decoder_train_backward_cpu(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
                           Tensor completion_ids, Tensor completion_mask, Tensor embed,
                           std::vector<Tensor> input_norm, std::vector<Tensor> qkv_weight,
                           std::vector<Tensor> qkv_bias, std::vector<Tensor> o_weight,
                           std::vector<Tensor> post_norm, std::vector<Tensor> gate_up_weight,
                           std::vector<Tensor> down_weight, Tensor final_norm, Tensor cos,
                           Tensor sin, Tensor residuals, Tensor qkv, Tensor probs, Tensor attended,
                           Tensor gate_up, int64_t num_heads, int64_t kv_heads, double eps) {
  const char* op = "decoder_train_backward";
  const Weights w = decoder::check_layers(
      op, embed, std::move(input_norm), std::move(qkv_weight), std::move(qkv_bias),
      std::move(o_weight), std::move(post_norm), std::move(gate_up_weight), std::move(down_weight),
      final_norm, cos, sin, num_heads, kv_heads, eps);
  const Layout lay =
      decoder::layout(op, prompt_ids, prompt_mask, completion_ids, completion_mask, w);
  const int64_t L = w.layers, N = lay.N, S = lay.capacity, H = w.hidden, Q = w.qkv_width,
                I = w.intermediate;
  const int64_t D = w.head_dim, heads = w.num_heads, kv = w.kv_heads;
  const int64_t A = heads * D, K = lay.K, B = lay.B, C = lay.C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto check_saved = [&](const Tensor& t, const char* name, int64_t r, int64_t c) {
    STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float && t.dim() == 2 && t.is_cpu() &&
                        t.is_contiguous() && t.size(0) == r && t.size(1) == c,
                    op, ": ", name, " must be decoder_train's contiguous float32 [", r, ", ", c,
                    "]");
  };
  STD_TORCH_CHECK(grad_hidden.scalar_type() == ScalarType::Float && grad_hidden.dim() == 2 &&
                      grad_hidden.is_cpu() && grad_hidden.size(0) == B * C &&
                      grad_hidden.size(1) == H,
                  op, ": grad_hidden must be a CPU float32 [B * C, H] = [", B * C, ", ", H, "]");
  grad_hidden = as_contiguous(grad_hidden);
  check_saved(residuals, "residuals", (2 * L + 1) * S, H);
  check_saved(qkv, "qkv", L * S, Q);
  check_saved(probs, "probs", L * S, heads * K);
  check_saved(attended, "attended", L * S, A);
  check_saved(gate_up, "gate_up", L * S, 2 * I);

  std::vector<Tensor> g_input_norm, g_qkv, g_bias, g_o, g_post_norm, g_gate_up, g_down;
  for (int64_t l = 0; l < L; ++l) {
    g_input_norm.push_back(zeros(embed, H));
    g_post_norm.push_back(zeros(embed, H));
    g_qkv.push_back(new_contiguous(embed, {Q, H}));
    g_o.push_back(new_contiguous(embed, {H, A}));
    g_gate_up.push_back(new_contiguous(embed, {2 * I, H}));
    g_down.push_back(new_contiguous(embed, {H, I}));
    if (!w.qkv_bias.empty()) g_bias.push_back(zeros(embed, Q));
  }
  Tensor g_final = zeros(embed, H);
  Tensor dx = zeros(embed, N, H);          // gradient of the residual stream leaving layer l
  Tensor dmid = new_float(embed, {N, H});  // ... after layer l's attention
  Tensor h = new_float(embed, {N, H});
  Tensor dh = new_float(embed, {N, H});
  Tensor act = new_float(embed, {N, I});
  Tensor dact = new_float(embed, {N, I});
  Tensor dgate_up = new_float(embed, {N, 2 * I});
  Tensor datt = new_float(embed, {N, A});
  Tensor dqkv = new_float(embed, {N, Q});
  const float* res = residuals.const_data_ptr<float>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  std::vector<float> dp(static_cast<size_t>(K)), silu_scratch(static_cast<size_t>(I)),
      wdy(static_cast<size_t>(H));
  float* dxp = dx.mutable_data_ptr<float>();
  float* dmp = dmid.mutable_data_ptr<float>();

  // The final norm, from each completion token's predicting row.
  const float* last = res + 2 * L * S * H;
  const float* gh = grad_hidden.const_data_ptr<float>();
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t s = lay.source(r, c);
      rms_norm_backward(gh + (r * C + c) * H, last + s * H, w.final_norm.const_data_ptr<float>(), 1,
                        H, w.eps, dxp + s * H, g_final.mutable_data_ptr<float>(), wdy.data());
    }
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    const float* xin = res + 2 * l * S * H;
    const float* xmid = res + (2 * l + 1) * S * H;
    // The rows the forward ran this layer's attention and MLP on (the last layer skips the quiet
    // rows); before `first` the residual passes straight through.
    const int64_t first = l == L - 1 ? lay.quiet() : 0, M = N - first;
    const Tensor gate_up_l = rows(gate_up, l * S + first, M);
    const Tensor dx_m = rows(dx, first, M), dmid_m = rows(dmid, first, M);
    Tensor dact_m = rows(dact, 0, M), act_m = rows(act, 0, M), h_m = rows(h, 0, M);
    Tensor dgate_up_m = rows(dgate_up, 0, M), dh_m = rows(dh, 0, M), datt_m = rows(datt, first, M);
    // The MLP: x_out = x_mid + (silu(gate) * up) @ down^T, gate_up = rms_norm(x_mid) @ W^T.
    decoder::mm(dact_m, dx_m, w.down_weight[l]);
    silu_gate_backward(gate_up_l.const_data_ptr<float>(), dact.const_data_ptr<float>(), M, I,
                       dgate_up.mutable_data_ptr<float>(), act.mutable_data_ptr<float>(),
                       silu_scratch.data());
    decoder::mm(g_down[l], transposed(dx_m), act_m);
    decoder::rms_norm(h.mutable_data_ptr<float>(), xmid + first * H,
                      w.post_norm[l].const_data_ptr<float>(), M, H, w.eps);
    decoder::mm(g_gate_up[l], transposed(dgate_up_m), h_m);
    decoder::mm(dh_m, dgate_up_m, w.gate_up_weight[l]);
    std::memcpy(dmp, dxp, sizeof(float) * N * H);
    rms_norm_backward(dh.const_data_ptr<float>(), xmid + first * H,
                      w.post_norm[l].const_data_ptr<float>(), M, H, w.eps, dmp + first * H,
                      g_post_norm[l].mutable_data_ptr<float>(), wdy.data());
    // The attention's output projection: x_mid = x_in + attended @ o^T.
    decoder::mm(g_o[l], transposed(dmid_m), rows(attended, l * S + first, M));
    decoder::mm(datt_m, dmid_m, w.o_weight[l]);
    // The attention: softmax over each query's slots, then the rotation.
    float* dq = dqkv.mutable_data_ptr<float>();
    decoder::attention_backward(qkv.const_data_ptr<float>() + l * S * Q,
                                probs.const_data_ptr<float>() + l * S * heads * K,
                                datt.const_data_ptr<float>(), lay.key_row.data(), first, N, K, Q,
                                heads, kv, D, scale, dq, dp.data());
    for (int64_t n = 0; n < N; ++n) {
      const int64_t p = lay.position[n];
      for (int64_t head = 0; head < heads + kv; ++head) {
        unrotate_grad(dq + n * Q + head * D, cp + p * D, sp + p * D, D);
      }
    }
    if (!w.qkv_bias.empty()) {
      float* gb = g_bias[l].mutable_data_ptr<float>();
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < Q; ++j) gb[j] += dq[n * Q + j];
      }
    }
    // The q/k/v projection of rms_norm(x_in).
    decoder::rms_norm(h.mutable_data_ptr<float>(), xin, w.input_norm[l].const_data_ptr<float>(), N,
                      H, w.eps);
    decoder::mm(g_qkv[l], transposed(dqkv), h);
    decoder::mm(dh, dqkv, w.qkv_weight[l]);
    std::memcpy(dxp, dmp, sizeof(float) * N * H);
    rms_norm_backward(dh.const_data_ptr<float>(), xin, w.input_norm[l].const_data_ptr<float>(), N,
                      H, w.eps, dxp, g_input_norm[l].mutable_data_ptr<float>(), wdy.data());
  }
  Tensor g_embed = embedding_gradient(embed, lay, dxp, H);
  // The norms' and bias's gradients were summed in float32: in the weights' dtype.
  for (auto* list : {&g_input_norm, &g_post_norm, &g_bias}) {
    for (Tensor& g : *list) g = decoder::cast_like(g, embed);
  }
  g_final = decoder::cast_like(g_final, embed);
  return {g_embed, g_input_norm, g_qkv, g_bias, g_o, g_post_norm, g_gate_up, g_down, g_final};
}

}  // namespace nostall
