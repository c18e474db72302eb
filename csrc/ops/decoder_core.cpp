#include "ops/decoder_core.h"

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/tensor_utils.h"

namespace nostall::decoder {

namespace {

void check_tensor(const char* op, const Tensor& t, const char* name, int64_t dims,
                  ScalarType dtype) {
  STD_TORCH_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ",
                  torch::headeronly::toString(dtype), ", got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.dim() == dims, op, ": ", name, " must have ", dims, " dimensions, got ",
                  t.dim());
  STD_TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  STD_TORCH_CHECK(t.is_cpu(), op, ": ", name, " must be a CPU tensor");
}

void check_float(const char* op, const Tensor& t, const char* name, int64_t dims) {
  check_tensor(op, t, name, dims, ScalarType::Float);
}

// n values between float32 and bf16 (vectorized loops: torch's cast costs about 100 us a call
// at a decoder's activation sizes, against a few here).
NOSTALL_AVX2_CLONES void narrow_all(uint16_t* __restrict out, const float* __restrict in,
                                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = narrow_bf16(in[i]);
}

NOSTALL_AVX2_CLONES void widen_all(float* __restrict out, const uint16_t* __restrict in,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = widen_bf16(in[i]);
}

// out = t converted between float32 and bf16, element for element (both contiguous).
void convert(Tensor& out, const Tensor& t) {
  const int64_t n = t.numel();
  if (out.scalar_type() == ScalarType::BFloat16) {
    narrow_all(static_cast<uint16_t*>(out.mutable_data_ptr()), t.const_data_ptr<float>(), n);
  } else {
    widen_all(out.mutable_data_ptr<float>(), static_cast<const uint16_t*>(t.const_data_ptr()), n);
  }
}

Tensor copy_as(const Tensor& t, int32_t dtype) {
  if (t.dim() == 2 && !t.is_contiguous() && t.stride(0) == 1 && t.stride(1) == t.size(0)) {
    // A transpose of a contiguous tensor (a weight gradient's operand): converted untransposed.
    return transposed(copy_as(transposed(t), dtype));
  }
  Tensor out = t.dim() == 1 ? new_contiguous(t, {t.size(0)}, dtype)
                            : new_contiguous(t, {t.size(0), t.size(1)}, dtype);
  if (t.is_contiguous()) {
    convert(out, t);
  } else {
    STD_TORCH_CHECK(aoti_torch_copy_(out.get(), t.get(), false) == AOTI_TORCH_SUCCESS,
                    "decoder: could not convert a tensor");
  }
  return out;
}

// out (any strides) = t (contiguous) in out's dtype.
void convert_into(Tensor& out, const Tensor& t) {
  if (out.is_contiguous()) return convert(out, t);
  STD_TORCH_CHECK(aoti_torch_copy_(out.get(), t.get(), false) == AOTI_TORCH_SUCCESS,
                  "decoder: could not convert a tensor");
}

int32_t dtype_code(const Tensor& t) {
  int32_t dtype = 0;
  STD_TORCH_CHECK(aoti_torch_get_dtype(t.get(), &dtype) == AOTI_TORCH_SUCCESS,
                  "decoder: could not read a tensor's dtype");
  return dtype;
}

void check_shape(const char* op, const Tensor& t, const char* name, int64_t i, int64_t rows,
                 int64_t cols) {
  const bool ok = cols < 0 ? t.size(0) == rows : (t.size(0) == rows && t.size(1) == cols);
  STD_TORCH_CHECK(ok, op, ": ", name, "[", i, "] must be [", rows, cols < 0 ? "" : ", ",
                  cols < 0 ? "" : std::to_string(cols), "]");
}

}  // namespace

Tensor as_float(const Tensor& t) {
  return t.scalar_type() == ScalarType::Float ? t : copy_as(t, aoti_torch_dtype_float32());
}

Tensor cast_like(const Tensor& t, const Tensor& like) {
  return t.scalar_type() == like.scalar_type() ? t : copy_as(t, dtype_code(like));
}

// out = x @ w^T (+ bias): x [N, K], w [M, K] (nn.Linear's layout), out [N, M].
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  if (x.scalar_type() != w.scalar_type() || out.scalar_type() != w.scalar_type()) {
    // float32 activations over bf16 weights: the GEMM in bf16 (float32 accumulation inside).
    Tensor low = new_contiguous(w, {out.size(0), out.size(1)});
    linear(low, cast_like(x, w), w, bias);
    convert_into(out, low);
    return;
  }
  const AOTITorchError err =
      bias != nullptr
          ? aoti_torch_cpu_addmm_out(out.get(), bias->get(), x.get(), transposed(w).get(), 1.0, 1.0)
          : aoti_torch_cpu_mm_out(out.get(), x.get(), transposed(w).get());
  STD_TORCH_CHECK(err == AOTI_TORCH_SUCCESS, "decoder: matrix product failed");
}

// (An AVX2 clone where the CPU has it, as for every loop below that runs per token.)
NOSTALL_AVX2_CLONES void rms_norm(float* out, const float* x, const float* weight, int64_t N,
                                  int64_t H, float eps) {
  for (int64_t b = 0; b < N; ++b) {
    const float* xb = x + b * H;
    const float scale = 1.0f / std::sqrt(dot(xb, xb, H) / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j) out[b * H + j] = weight[j] * (xb[j] * scale);
  }
}

void mm(Tensor& out, const Tensor& a, const Tensor& b) {
  const ScalarType dtype = out.scalar_type();
  if (a.scalar_type() != dtype || b.scalar_type() != dtype) {
    // float32 beside bf16 (an operand or the result): the product in bf16 (accumulated in
    // float32 inside), the result cast to out's dtype.
    const Tensor& low = dtype != ScalarType::Float             ? out
                        : a.scalar_type() != ScalarType::Float ? a
                                                               : b;
    Tensor result =
        dtype == low.scalar_type() ? out : new_contiguous(low, {out.size(0), out.size(1)});
    mm(result, cast_like(a, low), cast_like(b, low));
    if (dtype != low.scalar_type()) convert_into(out, result);
    return;
  }
  STD_TORCH_CHECK(aoti_torch_cpu_mm_out(out.get(), a.get(), b.get()) == AOTI_TORCH_SUCCESS,
                  "decoder: matrix product failed");
}

void mm_add(Tensor& out, const Tensor& a, const Tensor& b) {
  const Tensor a_out = cast_like(a, out), b_out = cast_like(b, out);
  STD_TORCH_CHECK(aoti_torch_cpu_addmm_out(out.get(), out.get(), a_out.get(), b_out.get(), 1.0,
                                           1.0) == AOTI_TORCH_SUCCESS,
                  "decoder: matrix product failed");
}

// act [N, I] = silu(gate) * up, gate_up [N, 2I]: an AVX2 clone where the CPU has it (chosen
// once at load), plain SSE otherwise.
NOSTALL_AVX2_CLONES void silu_gate(const float* gate_up, float* act, int64_t N, int64_t I,
                                   float* scratch) {
  for (int64_t b = 0; b < N; ++b) {
    const float* gate = gate_up + b * 2 * I;
    const float* up = gate + I;
    float* out = act + b * I;
    for (int64_t i = 0; i < I; ++i) scratch[i] = fast_exp(-gate[i]);
    for (int64_t i = 0; i < I; ++i) out[i] = gate[i] / (1.0f + scratch[i]) * up[i];
  }
}

Weights check_layers(const char* op, LayerWeights weights, Tensor cos, Tensor sin,
                     int64_t num_heads, int64_t kv_heads, double eps) {
  auto& [embed, input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight,
         final_norm] = weights;
  const int64_t L = static_cast<int64_t>(input_norm.size());
  STD_TORCH_CHECK(L >= 1, op, ": at least one layer");
  STD_TORCH_CHECK(static_cast<int64_t>(qkv_weight.size()) == L &&
                      static_cast<int64_t>(o_weight.size()) == L &&
                      static_cast<int64_t>(post_norm.size()) == L &&
                      static_cast<int64_t>(gate_up_weight.size()) == L &&
                      static_cast<int64_t>(down_weight.size()) == L &&
                      (qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == L),
                  op, ": every per-layer list must have ", L, " entries");
  STD_TORCH_CHECK(
      embed.scalar_type() == ScalarType::Float || embed.scalar_type() == ScalarType::BFloat16, op,
      ": embed must be float32 or bfloat16, got ",
      torch::headeronly::toString(embed.scalar_type()));
  const ScalarType dtype = embed.scalar_type();
  check_tensor(op, embed, "embed", 2, dtype);
  check_tensor(op, final_norm, "final_norm", 1, dtype);
  check_float(op, cos, "cos", 2);
  check_float(op, sin, "sin", 2);
  const int64_t H = embed.size(1), D = cos.size(1);
  STD_TORCH_CHECK(num_heads >= 1 && kv_heads >= 1 && num_heads % kv_heads == 0, op,
                  ": num_heads must be a multiple of kv_heads");
  STD_TORCH_CHECK(D >= 2 && D % 2 == 0, op, ": the head dimension (cos.size(1)) must be even");
  STD_TORCH_CHECK(final_norm.size(0) == H, op, ": final_norm must be [H], H = ", H);
  STD_TORCH_CHECK(sin.size(1) == D && sin.size(0) == cos.size(0), op,
                  ": cos and sin must be [positions, D], D = ", D);
  const int64_t Q = (num_heads + 2 * kv_heads) * D;
  int64_t I = -1;
  for (int64_t l = 0; l < L; ++l) {
    check_tensor(op, input_norm[l], "input_norm", 1, dtype);
    check_tensor(op, post_norm[l], "post_norm", 1, dtype);
    check_tensor(op, qkv_weight[l], "qkv_weight", 2, dtype);
    check_tensor(op, o_weight[l], "o_weight", 2, dtype);
    check_tensor(op, gate_up_weight[l], "gate_up_weight", 2, dtype);
    check_tensor(op, down_weight[l], "down_weight", 2, dtype);
    check_shape(op, input_norm[l], "input_norm", l, H, -1);
    check_shape(op, post_norm[l], "post_norm", l, H, -1);
    check_shape(op, qkv_weight[l], "qkv_weight", l, Q, H);
    check_shape(op, o_weight[l], "o_weight", l, H, num_heads * D);
    if (I < 0) I = gate_up_weight[l].size(0) / 2;
    check_shape(op, gate_up_weight[l], "gate_up_weight", l, 2 * I, H);
    check_shape(op, down_weight[l], "down_weight", l, H, I);
    if (!qkv_bias.empty()) {
      check_tensor(op, qkv_bias[l], "qkv_bias", 1, dtype);
      check_shape(op, qkv_bias[l], "qkv_bias", l, Q, -1);
    }
  }
  Weights w;
  w.bf16 = dtype == ScalarType::BFloat16;
  for (Tensor& t : input_norm) t = as_float(t);  // (H values a layer: widened per call)
  for (Tensor& t : post_norm) t = as_float(t);
  w.embed = embed;
  w.input_norm = std::move(input_norm);
  w.qkv_weight = std::move(qkv_weight);
  w.qkv_bias = std::move(qkv_bias);
  w.o_weight = std::move(o_weight);
  w.post_norm = std::move(post_norm);
  w.gate_up_weight = std::move(gate_up_weight);
  w.down_weight = std::move(down_weight);
  w.final_norm = as_float(final_norm);
  w.cos = cos;
  w.sin = sin;
  w.layers = L;
  w.vocab = embed.size(0);
  w.hidden = H;
  w.qkv_width = Q;
  w.intermediate = I;
  w.head_dim = D;
  w.num_heads = num_heads;
  w.kv_heads = kv_heads;
  w.eps = static_cast<float>(eps);
  return w;
}

Weights check(const char* op, LayerWeights weights, Tensor lm_head, Tensor cos, Tensor sin,
              const Tensor& keys, const Tensor& values, int64_t num_heads, int64_t kv_heads,
              double eps) {
  Weights w = check_layers(op, std::move(weights), cos, sin, num_heads, kv_heads, eps);
  check_tensor(op, lm_head, "lm_head", 2, w.embed.scalar_type());
  check_float(op, keys, "keys", 5);
  check_float(op, values, "values", 5);
  STD_TORCH_CHECK(keys.size(4) == w.head_dim, op,
                  ": keys must be [L, B, kv_heads, S, D], D = ", w.head_dim,
                  " (the rotary tables')");
  STD_TORCH_CHECK(keys.size(0) == w.layers && keys.size(2) == kv_heads, op,
                  ": keys must be [L, B, kv_heads, S, D] with L = ", w.layers,
                  ", kv_heads = ", kv_heads);
  for (int64_t d = 0; d < 5; ++d) {
    STD_TORCH_CHECK(values.size(d) == keys.size(d), op, ": values must match keys");
  }
  STD_TORCH_CHECK(lm_head.size(1) == w.hidden, op, ": lm_head must be [V, H], H = ", w.hidden);
  w.lm_head = lm_head;
  w.slots = keys.size(3);
  w.cache_rows = keys.size(1);
  return w;
}

void embedding_row(const Weights& w, int64_t token, float* row) {
  const int64_t H = w.hidden;
  if (w.bf16) {
    const auto* ep = static_cast<const uint16_t*>(w.embed.const_data_ptr()) + token * H;
    for (int64_t j = 0; j < H; ++j) row[j] = widen_bf16(ep[j]);
  } else {
    std::memcpy(row, w.embed.const_data_ptr<float>() + token * H, sizeof(float) * H);
  }
}

void embed_tokens(const Weights& w, const int64_t* tokens, int64_t N, Tensor& x) {
  float* xp = x.mutable_data_ptr<float>();
  for (int64_t b = 0; b < N; ++b) embedding_row(w, tokens[b], xp + b * w.hidden);
}

void run_layers(const Weights& w, Tensor& x, const Attend& attend) {
  const int64_t N = x.size(0), H = w.hidden, I = w.intermediate;
  Tensor h = new_contiguous(x, {N, H});
  Tensor tmp = new_contiguous(x, {N, H});
  Tensor qkv = new_contiguous(x, {N, w.qkv_width});
  Tensor att = new_contiguous(x, {N, w.num_heads * w.head_dim});
  Tensor gate_up = new_contiguous(x, {N, 2 * I});
  Tensor act = new_contiguous(x, {N, I});
  std::vector<float> scratch(static_cast<size_t>(I));
  float* xp = x.mutable_data_ptr<float>();
  const float* tp = tmp.const_data_ptr<float>();
  for (int64_t l = 0; l < w.layers; ++l) {
    rms_norm(h.mutable_data_ptr<float>(), xp, w.input_norm[l].const_data_ptr<float>(), N, H, w.eps);
    linear(qkv, h, w.qkv_weight[l], w.qkv_bias.empty() ? nullptr : &w.qkv_bias[l]);
    attend(l, qkv.mutable_data_ptr<float>(), att.mutable_data_ptr<float>());
    linear(tmp, att, w.o_weight[l], nullptr);
    for (int64_t i = 0; i < N * H; ++i) xp[i] += tp[i];
    rms_norm(h.mutable_data_ptr<float>(), xp, w.post_norm[l].const_data_ptr<float>(), N, H, w.eps);
    linear(gate_up, h, w.gate_up_weight[l], nullptr);
    silu_gate(gate_up.const_data_ptr<float>(), act.mutable_data_ptr<float>(), N, I, scratch.data());
    linear(tmp, act, w.down_weight[l], nullptr);
    for (int64_t i = 0; i < N * H; ++i) xp[i] += tp[i];
  }
}

Tensor logits(const Weights& w, const Tensor& x) {
  const int64_t N = x.size(0);
  Tensor h = new_contiguous(x, {N, w.hidden});
  rms_norm(h.mutable_data_ptr<float>(), x.const_data_ptr<float>(),
           w.final_norm.const_data_ptr<float>(), N, w.hidden, w.eps);
  Tensor out = new_contiguous(x, {N, w.vocab});
  linear(out, h, w.lm_head, nullptr);
  return out;
}

namespace {

// attend_one's loop at any head size D.
NOSTALL_ALWAYS_INLINE inline void attend_one_rows(const float* q, const float* keys,
                                                  const float* values, int64_t S, int64_t D,
                                                  float scale, const bool* allowed, float* scores,
                                                  float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < S; ++t) {
    if (!allowed[t]) continue;
    scores[t] = dot(q, keys + t * D, D) * scale;
    m = scores[t] > m ? scores[t] : m;
  }
  float total = 0.0f;
  for (int64_t t = 0; t < S; ++t) {
    if (!allowed[t]) continue;
    scores[t] = fast_exp(scores[t] - m);
    total += scores[t];
  }
  for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int64_t t = 0; t < S; ++t) {
    if (allowed[t]) axpy(out, scores[t] / total, values + t * D, D);
  }
}

// The same at D = 8 kV, the query and the output held in registers (as decoder_train's
// attention, csrc/ops/decoder_attention.cpp), the sums in the same order.
template <int64_t kV>
NOSTALL_ALWAYS_INLINE inline void attend_one_vec(const float* q, const float* keys,
                                                 const float* values, int64_t S, float scale,
                                                 const bool* allowed, float* scores, float* out) {
  constexpr int64_t D = 8 * kV;
  Vec8 query[kV], acc[kV] = {};
  for (int64_t v = 0; v < kV; ++v) query[v] = load8(q + 8 * v);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < S; ++t) {
    if (!allowed[t]) continue;
    Vec8 sum = query[0] * load8(keys + t * D);
    for (int64_t v = 1; v < kV; ++v) sum += query[v] * load8(keys + t * D + 8 * v);
    scores[t] = sum8(sum) * scale;
    m = scores[t] > m ? scores[t] : m;
  }
  float total = 0.0f;
  for (int64_t t = 0; t < S; ++t) {
    if (!allowed[t]) continue;
    scores[t] = fast_exp(scores[t] - m);
    total += scores[t];
  }
  for (int64_t t = 0; t < S; ++t) {
    if (!allowed[t]) continue;
    const float p = scores[t] / total;
    for (int64_t v = 0; v < kV; ++v) acc[v] += p * load8(values + t * D + 8 * v);
  }
  for (int64_t v = 0; v < kV; ++v) store8(out + 8 * v, acc[v]);
}

}  // namespace

NOSTALL_AVX2_CLONES void attend_one(const float* q, const float* keys, const float* values,
                                    int64_t S, int64_t D, float scale, const bool* allowed,
                                    float* scores, float* out) {
  switch (D) {
    case 16:
      return attend_one_vec<2>(q, keys, values, S, scale, allowed, scores, out);
    case 32:
      return attend_one_vec<4>(q, keys, values, S, scale, allowed, scores, out);
    case 64:
      return attend_one_vec<8>(q, keys, values, S, scale, allowed, scores, out);
    case 128:
      return attend_one_vec<16>(q, keys, values, S, scale, allowed, scores, out);
    default:
      return attend_one_rows(q, keys, values, S, D, scale, allowed, scores, out);
  }
}

}  // namespace nostall::decoder
