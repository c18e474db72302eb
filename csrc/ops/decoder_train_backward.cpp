// CPU kernel of decoder_train_backward (see decoder_train.h): the forward's adjoints, layer by
// layer from the last, over the activations the forward saved.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

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

// Where the backward puts each weight's gradient: fresh tensors (decoder_train_backward) or
// views of one flat buffer laid out in the op's output order (decoder_train_backward_into), set
// or, with `accumulate`, added into.
struct Sink {
  Tensor embed, final_norm;
  std::vector<Tensor> input_norm, qkv, bias, o, post_norm, gate_up, down;
  bool accumulate = false;
};

// out = a @ b, or out += a @ b (in out's dtype).
void weight_gradient(Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  if (accumulate) {
    decoder::mm_add(out, a, b);
  } else {
    decoder::mm(out, a, b);
  }
}

// out[0..n) (float32 or bf16) = or += sum[0..n) (float32).
void store(void* out, ScalarType dtype, const float* sum, int64_t n, bool accumulate) {
  if (dtype == ScalarType::Float) {
    auto* o = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = accumulate ? o[i] + sum[i] : sum[i];
  } else {
    auto* o = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) {
      o[i] = decoder::narrow_bf16(accumulate ? decoder::widen_bf16(o[i]) + sum[i] : sum[i]);
    }
  }
}

void store(Tensor& out, const Tensor& sum, bool accumulate) {
  store(out.mutable_data_ptr(), out.scalar_type(), sum.const_data_ptr<float>(), out.numel(),
        accumulate);
}

// The embedding's gradient [V, H]: each run row's dx [N, H] summed per token in float32, each
// token's row stored once (bf16 rounds once: a token the batch repeats would lose bits on every
// addition otherwise), the other rows zero (or, accumulating, as they were).
void store_embedding(Tensor& out, const Layout& lay, const float* dx, int64_t H, bool accumulate) {
  std::unordered_map<int64_t, int64_t> slot_of;
  std::vector<float> sums;
  for (int64_t n = 0; n < lay.N; ++n) {
    const auto [it, added] =
        slot_of.try_emplace(lay.token[n], static_cast<int64_t>(slot_of.size()));
    if (added) sums.resize(sums.size() + static_cast<size_t>(H), 0.0f);
    decoder::axpy(sums.data() + it->second * H, 1.0f, dx + n * H, H);
  }
  const ScalarType dtype = out.scalar_type();
  const size_t bytes = dtype == ScalarType::Float ? sizeof(float) : sizeof(uint16_t);
  auto* base = static_cast<char*>(out.mutable_data_ptr());
  if (!accumulate) std::memset(base, 0, bytes * static_cast<size_t>(out.numel()));
  for (const auto& [token, slot] : slot_of) {
    store(base + bytes * static_cast<size_t>(token * H), dtype, sums.data() + slot * H, H,
          accumulate);
  }
}

// A view of `count` elements of flat at `offset`, shaped `sizes` (1 or 2 dimensions).
Tensor flat_view(const Tensor& flat, int64_t& offset, std::initializer_list<int64_t> sizes) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  const int64_t* size = sizes.begin();
  const int64_t strides[2] = {ndim == 2 ? size[1] : 1, 1};
  AtenTensorHandle out = nullptr;
  STD_TORCH_CHECK(aoti_torch__reinterpret_tensor(flat.get(), ndim, size, strides, offset, &out) ==
                      AOTI_TORCH_SUCCESS,
                  "decoder_train_backward_into: could not make a view");
  offset += ndim == 2 ? size[0] * size[1] : size[0];
  return Tensor(out);
}

// Views of flat_grad in the op's output order: the embedding, each list layer by layer, the final
// norm (so its entries, end to end, are the gradients decoder_train_backward returns).
Sink flat_sink(const char* op, const Tensor& flat, const Weights& w, bool accumulate) {
  const int64_t L = w.layers, V = w.vocab, H = w.hidden, Q = w.qkv_width, I = w.intermediate;
  const int64_t A = w.num_heads * w.head_dim, bias = w.qkv_bias.empty() ? 0 : Q;
  const int64_t total = V * H + L * (2 * H + Q * H + bias + H * A + 2 * I * H + H * I) + H;
  STD_TORCH_CHECK(flat.scalar_type() == w.embed.scalar_type() && flat.dim() == 1 &&
                      flat.is_contiguous() && flat.is_cpu() && flat.numel() == total,
                  op, ": flat_grad must be a contiguous CPU ",
                  torch::headeronly::toString(w.embed.scalar_type()), " [", total,
                  "] (every weight's gradient, in the op's output order)");
  Sink sink;
  sink.accumulate = accumulate;
  int64_t offset = 0;
  sink.embed = flat_view(flat, offset, {V, H});
  for (int64_t l = 0; l < L; ++l) sink.input_norm.push_back(flat_view(flat, offset, {H}));
  for (int64_t l = 0; l < L; ++l) sink.qkv.push_back(flat_view(flat, offset, {Q, H}));
  for (int64_t l = 0; l < L && bias > 0; ++l) sink.bias.push_back(flat_view(flat, offset, {Q}));
  for (int64_t l = 0; l < L; ++l) sink.o.push_back(flat_view(flat, offset, {H, A}));
  for (int64_t l = 0; l < L; ++l) sink.post_norm.push_back(flat_view(flat, offset, {H}));
  for (int64_t l = 0; l < L; ++l) sink.gate_up.push_back(flat_view(flat, offset, {2 * I, H}));
  for (int64_t l = 0; l < L; ++l) sink.down.push_back(flat_view(flat, offset, {H, I}));
  sink.final_norm = flat_view(flat, offset, {H});
  return sink;
}

// Fresh tensors in the weights' dtype.
Sink fresh_sink(const Weights& w) {
  const int64_t L = w.layers, H = w.hidden, Q = w.qkv_width, I = w.intermediate;
  const int64_t A = w.num_heads * w.head_dim;
  const Tensor& like = w.embed;
  Sink sink;
  sink.embed = new_contiguous(like, {w.vocab, H});
  for (int64_t l = 0; l < L; ++l) {
    sink.input_norm.push_back(new_contiguous(like, {H}));
    sink.qkv.push_back(new_contiguous(like, {Q, H}));
    if (!w.qkv_bias.empty()) sink.bias.push_back(new_contiguous(like, {Q}));
    sink.o.push_back(new_contiguous(like, {H, A}));
    sink.post_norm.push_back(new_contiguous(like, {H}));
    sink.gate_up.push_back(new_contiguous(like, {2 * I, H}));
    sink.down.push_back(new_contiguous(like, {H, I}));
  }
  sink.final_norm = new_contiguous(like, {H});
  return sink;
}

// The backward into the sink make_sink gives for the checked weights.
void backward(const char* op, Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
              Tensor completion_ids, Tensor completion_mask, decoder::LayerWeights weights,
              Tensor cos, Tensor sin, Tensor residuals, Tensor qkv, Tensor probs, Tensor attended,
              Tensor gate_up, int64_t num_heads, int64_t kv_heads, double eps,
              const std::function<Sink(const Weights&)>& make_sink, Sink& sink) {
  const Weights w =
      decoder::check_layers(op, std::move(weights), cos, sin, num_heads, kv_heads, eps);
  const Tensor& embed = w.embed;  // (the template of every buffer below: its device)
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

  sink = make_sink(w);
  const bool acc = sink.accumulate;
  // The norms' and biases' gradients are sums over rows: in float32, stored at the end.
  std::vector<Tensor> g_input_norm, g_bias, g_post_norm;
  for (int64_t l = 0; l < L; ++l) {
    g_input_norm.push_back(zeros(embed, H));
    g_post_norm.push_back(zeros(embed, H));
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
  std::vector<float> silu_scratch(static_cast<size_t>(I)), wdy(static_cast<size_t>(H));
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
    weight_gradient(sink.down[l], transposed(dx_m), act_m, acc);
    decoder::rms_norm(h.mutable_data_ptr<float>(), xmid + first * H,
                      w.post_norm[l].const_data_ptr<float>(), M, H, w.eps);
    weight_gradient(sink.gate_up[l], transposed(dgate_up_m), h_m, acc);
    decoder::mm(dh_m, dgate_up_m, w.gate_up_weight[l]);
    std::memcpy(dmp, dxp, sizeof(float) * N * H);
    rms_norm_backward(dh.const_data_ptr<float>(), xmid + first * H,
                      w.post_norm[l].const_data_ptr<float>(), M, H, w.eps, dmp + first * H,
                      g_post_norm[l].mutable_data_ptr<float>(), wdy.data());
    // The attention's output projection: x_mid = x_in + attended @ o^T.
    weight_gradient(sink.o[l], transposed(dmid_m), rows(attended, l * S + first, M), acc);
    decoder::mm(datt_m, dmid_m, w.o_weight[l]);
    // The attention: softmax over each query's slots, then the rotation.
    float* dq = dqkv.mutable_data_ptr<float>();
    std::memset(dq, 0, sizeof(float) * N * Q);
    // Key-value heads on every core: each writes its own columns of dq (the same sums).
    torch::stable::parallel_for(0, kv, 1, [&](int64_t kv_first, int64_t kv_last) {
      std::vector<float> dp(static_cast<size_t>(K));
      decoder::attention_backward(qkv.const_data_ptr<float>() + l * S * Q,
                                  probs.const_data_ptr<float>() + l * S * heads * K,
                                  datt.const_data_ptr<float>(), lay.key_row.data(), first, N, K, Q,
                                  heads, kv, D, scale, kv_first, kv_last, dq, dp.data());
    });
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
    weight_gradient(sink.qkv[l], transposed(dqkv), h, acc);
    decoder::mm(dh, dqkv, w.qkv_weight[l]);
    std::memcpy(dxp, dmp, sizeof(float) * N * H);
    rms_norm_backward(dh.const_data_ptr<float>(), xin, w.input_norm[l].const_data_ptr<float>(), N,
                      H, w.eps, dxp, g_input_norm[l].mutable_data_ptr<float>(), wdy.data());
  }
  store_embedding(sink.embed, lay, dxp, H, acc);
  for (int64_t l = 0; l < L; ++l) {
    store(sink.input_norm[l], g_input_norm[l], acc);
    store(sink.post_norm[l], g_post_norm[l], acc);
    if (!w.qkv_bias.empty()) store(sink.bias[l], g_bias[l], acc);
  }
  store(sink.final_norm, g_final, acc);
}

}  // namespace

std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>,
           Tensor>
decoder_train_backward_cpu(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
                           Tensor completion_ids, Tensor completion_mask,
                           NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin, Tensor residuals,
                           Tensor qkv, Tensor probs, Tensor attended, Tensor gate_up,
                           int64_t num_heads, int64_t kv_heads, double eps) {
  Sink g;
  backward("decoder_train_backward", grad_hidden, prompt_ids, prompt_mask, completion_ids,
           completion_mask, NOSTALL_DECODER_WEIGHTS_GATHER, cos, sin, residuals, qkv, probs,
           attended, gate_up, num_heads, kv_heads, eps, fresh_sink, g);
  return {g.embed, g.input_norm, g.qkv, g.bias, g.o, g.post_norm, g.gate_up, g.down, g.final_norm};
}

void decoder_train_backward_into_cpu(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask,
                                     Tensor completion_ids, Tensor completion_mask,
                                     NOSTALL_DECODER_WEIGHTS_PARAMS, Tensor cos, Tensor sin,
                                     Tensor residuals, Tensor qkv, Tensor probs, Tensor attended,
                                     Tensor gate_up, int64_t num_heads, int64_t kv_heads,
                                     double eps, Tensor flat_grad, bool accumulate) {
  const char* op = "decoder_train_backward_into";
  Sink g;
  backward(
      op, grad_hidden, prompt_ids, prompt_mask, completion_ids, completion_mask,
      NOSTALL_DECODER_WEIGHTS_GATHER, cos, sin, residuals, qkv, probs, attended, gate_up, num_heads,
      kv_heads, eps, [&](const Weights& w) { return flat_sink(op, flat_grad, w, accumulate); }, g);
}

}  // namespace nostall
