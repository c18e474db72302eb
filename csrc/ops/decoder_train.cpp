// CPU kernels of decoder_train and decoder_train_backward (see decoder_train.h).
#include "ops/decoder_train.h"

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "common/tensor_utils.h"
#include "ops/decoder_attention.h"
#include "ops/decoder_core.h"

namespace nostall {

namespace {

using decoder::Weights;

// Rows [start, start + count) of a contiguous 2-D tensor, as a view.
Tensor rows(const Tensor& t, int64_t start, int64_t count) {
  const int64_t cols = t.size(1);
  const int64_t sizes[2] = {count, cols};
  const int64_t strides[2] = {cols, 1};
  AtenTensorHandle out = nullptr;
  STD_TORCH_CHECK(aoti_torch__reinterpret_tensor(t.get(), 2, sizes, strides, start * cols, &out) ==
                      AOTI_TORCH_SUCCESS,
                  "decoder_train: could not make a row view");
  return Tensor(out);
}

Tensor zeros(const Tensor& like, int64_t r, int64_t c) {
  Tensor t = new_contiguous(like, {r, c});
  std::memset(t.mutable_data_ptr<float>(), 0, sizeof(float) * static_cast<size_t>(r * c));
  return t;
}

Tensor zeros(const Tensor& like, int64_t n) {
  Tensor t = new_contiguous(like, {n});
  std::memset(t.mutable_data_ptr<float>(), 0, sizeof(float) * static_cast<size_t>(n));
  return t;
}

// The batch's shape and, for each of the N token rows run, its token, its position and the row
// of the key behind each of its K = P + C - 1 attention slots (-1: masked).
// - A completion's last token predicts nothing and no other token attends to it: not run.
// - Completions of one group that begin alike share the rows of their common beginning (a row's
//   state depends only on its prompt and the tokens and mask up to it): one row per distinct
//   prefix, the tree a group's completions make. Late in training most of a group's
//   completions agree (about a quarter of the race's completion rows are shared on average),
//   and each shared row is computed once; its gradient is the sum over the completions that
//   read it, as the final norm's backward adds into it.
// - The rows: first every prompt's tokens but its last (`quiet` rows: read by the last layer
//   only as keys and values, so that layer's attention and MLP skip them), then each prompt's
//   last token, then the distinct completion prefixes. N <= capacity = Bp * P + B * (C - 1),
//   the rows the saved activations hold (their shapes do not depend on the data); rows past N
//   are zeros.
struct Layout {
  int64_t Bp = 0, P = 0, B = 0, C = 0, G = 0, N = 0, Np = 0, K = 0, capacity = 0;
  std::vector<int64_t> token, position, key_row;
  std::vector<int64_t> completion_row;   // [B, C - 1]: the row of each completion token run
  int64_t run() const { return C - 1; }  // completion tokens run per row
  int64_t quiet() const { return Bp * (P - 1); }
  // The row of prompt b's token i.
  int64_t prompt_row(int64_t b, int64_t i) const {
    return i == P - 1 ? quiet() + b : b * (P - 1) + i;
  }
  // The row whose final state predicts completion token (r, c).
  int64_t source(int64_t r, int64_t c) const {
    return c == 0 ? prompt_row(r / G, P - 1) : completion_row[r * run() + c - 1];
  }
};

Layout layout(const char* op, Tensor& prompt_ids, Tensor& prompt_mask, Tensor& completion_ids,
              Tensor& completion_mask, const Weights& w) {
  STD_TORCH_CHECK(
      prompt_ids.scalar_type() == ScalarType::Long && prompt_ids.dim() == 2 && prompt_ids.is_cpu(),
      op, ": prompt_ids must be a CPU int64 [Bp, P]");
  STD_TORCH_CHECK(completion_ids.scalar_type() == ScalarType::Long && completion_ids.dim() == 2 &&
                      completion_ids.is_cpu(),
                  op, ": completion_ids must be a CPU int64 [B, C]");
  // A group's rows share one prompt, so callers pass every G-th row: a strided view.
  prompt_ids = as_contiguous(prompt_ids);
  completion_ids = as_contiguous(completion_ids);
  Layout lay;
  lay.Bp = prompt_ids.size(0);
  lay.P = prompt_ids.size(1);
  lay.B = completion_ids.size(0);
  lay.C = completion_ids.size(1);
  STD_TORCH_CHECK(lay.Bp >= 1 && lay.P >= 1, op, ": prompt_ids must not be empty, got [", lay.Bp,
                  ", ", lay.P, "]");
  STD_TORCH_CHECK(lay.C >= 1 && lay.B >= lay.Bp && lay.B % lay.Bp == 0, op,
                  ": completion_ids must be [Bp * G, C] with Bp = ", lay.Bp, " and C >= 1, got [",
                  lay.B, ", ", lay.C, "]");
  STD_TORCH_CHECK(prompt_mask.scalar_type() == ScalarType::Bool && prompt_mask.dim() == 2 &&
                      prompt_mask.size(0) == lay.Bp && prompt_mask.size(1) == lay.P &&
                      prompt_mask.is_cpu(),
                  op, ": prompt_mask must be a CPU bool [Bp, P] = [", lay.Bp, ", ", lay.P, "]");
  STD_TORCH_CHECK(completion_mask.scalar_type() == ScalarType::Bool && completion_mask.dim() == 2 &&
                      completion_mask.size(0) == lay.B && completion_mask.size(1) == lay.C &&
                      completion_mask.is_cpu(),
                  op, ": completion_mask must be a CPU bool [B, C] = [", lay.B, ", ", lay.C, "]");
  prompt_mask = as_contiguous(prompt_mask);
  completion_mask = as_contiguous(completion_mask);
  const int64_t Bp = lay.Bp, P = lay.P, B = lay.B, C = lay.C, R = C - 1, K = P + R, V = w.vocab;
  lay.G = B / Bp;
  lay.Np = Bp * P;
  lay.capacity = lay.Np + B * R;
  lay.K = K;
  const int64_t S = lay.capacity, positions = w.cos.size(0);
  lay.token.resize(static_cast<size_t>(S));
  lay.position.resize(static_cast<size_t>(S));
  lay.key_row.assign(static_cast<size_t>(S * K), -1);
  const int64_t* pid = prompt_ids.const_data_ptr<int64_t>();
  const int64_t* cid = completion_ids.const_data_ptr<int64_t>();
  const bool* pm = prompt_mask.const_data_ptr<bool>();
  const bool* cm = completion_mask.const_data_ptr<bool>();
  // Each completion token's row: a new one for a prefix not seen in its group, keyed by the
  // parent's row (or the group, for a first token), the token and its mask bit.
  lay.completion_row.resize(static_cast<size_t>(B * R));
  std::unordered_map<uint64_t, int64_t> rows_of;
  int64_t next = lay.Np;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t c = 0; c < R; ++c) {
      const int64_t t = cid[r * C + c];
      STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
      const uint64_t parent = c == 0 ? static_cast<uint64_t>(r / lay.G)
                                     : static_cast<uint64_t>(lay.completion_row[r * R + c - 1]);
      const uint64_t key =
          ((parent * static_cast<uint64_t>(V) + static_cast<uint64_t>(t)) << 1) | cm[r * C + c];
      const auto [it, added] = rows_of.try_emplace(key, next);
      lay.completion_row[r * R + c] = it->second;
      next += added ? 1 : 0;
    }
  }
  lay.N = next;
  for (int64_t b = 0; b < Bp; ++b) {
    for (int64_t i = 0; i < P; ++i) {
      const int64_t t = pid[b * P + i];
      STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
      lay.token[lay.prompt_row(b, i)] = t;
    }
  }
  for (int64_t r = 0; r < B; ++r) {  // (the last token, not run, is checked too)
    const int64_t t = cid[r * C + C - 1];
    STD_TORCH_CHECK(t >= 0 && t < V, op, ": token ", t, " outside [0, ", V, ")");
  }
  for (int64_t b = 0; b < Bp; ++b) {
    STD_TORCH_CHECK(pm[b * P + P - 1], op, ": prompt ", b,
                    " must end in a real token (left padding)");
    int64_t count = 0;
    for (int64_t i = 0; i < P; ++i) {
      const int64_t n = lay.prompt_row(b, i);
      count += pm[b * P + i] ? 1 : 0;
      lay.position[n] = count > 0 ? count - 1 : 0;
      for (int64_t j = 0; j < P; ++j) {
        if ((j <= i && pm[b * P + j]) || j == i) lay.key_row[n * K + j] = lay.prompt_row(b, j);
      }
    }
  }
  for (int64_t r = 0; r < B; ++r) {
    const int64_t b = r / lay.G, last = lay.position[lay.prompt_row(b, P - 1)];
    int64_t count = 0;
    for (int64_t c = 0; c < R; ++c) {
      const int64_t n = lay.completion_row[r * R + c];  // (a shared row: written alike again)
      lay.token[n] = cid[r * C + c];
      count += cm[r * C + c] ? 1 : 0;
      lay.position[n] = last + (count > 0 ? count : 1);
      STD_TORCH_CHECK(lay.position[n] < positions, op, ": position ", lay.position[n],
                      " exceeds the rotary tables' ", positions, " positions");
      for (int64_t j = 0; j < P; ++j) {
        if (pm[b * P + j]) lay.key_row[n * K + j] = lay.prompt_row(b, j);
      }
      for (int64_t j = 0; j <= c; ++j) {
        if (cm[r * C + j] || j == c) lay.key_row[n * K + P + j] = lay.completion_row[r * R + j];
      }
    }
  }
  return lay;
}

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

void add_into(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> decoder_train_cpu(
    Tensor prompt_ids, Tensor prompt_mask, Tensor completion_ids, Tensor completion_mask,
    Tensor embed, std::vector<Tensor> input_norm, std::vector<Tensor> qkv_weight,
    std::vector<Tensor> qkv_bias, std::vector<Tensor> o_weight, std::vector<Tensor> post_norm,
    std::vector<Tensor> gate_up_weight, std::vector<Tensor> down_weight, Tensor final_norm,
    Tensor cos, Tensor sin, int64_t num_heads, int64_t kv_heads, double eps) {
  const char* op = "decoder_train";
  const Weights w = decoder::check_layers(
      op, embed, std::move(input_norm), std::move(qkv_weight), std::move(qkv_bias),
      std::move(o_weight), std::move(post_norm), std::move(gate_up_weight), std::move(down_weight),
      final_norm, cos, sin, num_heads, kv_heads, eps);
  const Layout lay = layout(op, prompt_ids, prompt_mask, completion_ids, completion_mask, w);
  const int64_t L = w.layers, N = lay.N, S = lay.capacity, H = w.hidden, Q = w.qkv_width,
                I = w.intermediate;
  const int64_t D = w.head_dim, heads = w.num_heads, kv = w.kv_heads;
  const int64_t A = heads * D, K = lay.K;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  Tensor residuals = new_contiguous(embed, {(2 * L + 1) * S, H});
  Tensor qkv = new_contiguous(embed, {L * S, Q});
  Tensor probs = new_contiguous(embed, {L * S, heads * K});
  Tensor attended = new_contiguous(embed, {L * S, A});
  Tensor gate_up = new_contiguous(embed, {L * S, 2 * I});
  Tensor h = new_contiguous(embed, {N, H});
  Tensor tmp = new_contiguous(embed, {N, H});
  Tensor act = new_contiguous(embed, {N, I});
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  std::vector<float> silu_scratch(static_cast<size_t>(I));

  float* res = residuals.mutable_data_ptr<float>();
  const float* ep = embed.const_data_ptr<float>();
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(res + n * H, ep + lay.token[n] * H, sizeof(float) * H);
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
    decoder::attention_forward(qp, lay.key_row.data(), first, N, K, Q, heads, kv, D, scale, probs_l,
                               attended_l);
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
  Tensor hidden = new_contiguous(embed, {lay.B * lay.C, H});
  float* hp = hidden.mutable_data_ptr<float>();
  const float* wn = final_norm.const_data_ptr<float>();
  for (int64_t r = 0; r < lay.B; ++r) {
    for (int64_t c = 0; c < lay.C; ++c) {
      decoder::rms_norm(hp + (r * lay.C + c) * H, last + lay.source(r, c) * H, wn, 1, H, w.eps);
    }
  }
  return {hidden, residuals, qkv, probs, attended, gate_up};
}

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
  const Layout lay = layout(op, prompt_ids, prompt_mask, completion_ids, completion_mask, w);
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
  Tensor dx = zeros(embed, N, H);               // gradient of the residual stream leaving layer l
  Tensor dmid = new_contiguous(embed, {N, H});  // ... after layer l's attention
  Tensor h = new_contiguous(embed, {N, H});
  Tensor dh = new_contiguous(embed, {N, H});
  Tensor act = new_contiguous(embed, {N, I});
  Tensor dact = new_contiguous(embed, {N, I});
  Tensor dgate_up = new_contiguous(embed, {N, 2 * I});
  Tensor datt = new_contiguous(embed, {N, A});
  Tensor dqkv = new_contiguous(embed, {N, Q});
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
      rms_norm_backward(gh + (r * C + c) * H, last + s * H, final_norm.const_data_ptr<float>(), 1,
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
  Tensor g_embed = zeros(embed, w.vocab, H);
  float* ge = g_embed.mutable_data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* row = ge + lay.token[n] * H;
    for (int64_t j = 0; j < H; ++j) row[j] += dxp[n * H + j];
  }
  return {g_embed, g_input_norm, g_qkv, g_bias, g_o, g_post_norm, g_gate_up, g_down, g_final};
}

}  // namespace nostall
