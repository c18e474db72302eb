// CPU kernel of decode_step (see decode_step.h): GEMMs through the C shim's addmm / mm (MKL or
// the platform BLAS, no dispatcher call), everything between them as plain loops.
#include "ops/decode_step.h"

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/tensor_utils.h"

namespace nostall {

namespace {

void check_float(const Tensor& t, const char* name, int64_t dims) {
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float, "decode_step: ", name,
                  " must be float32, got ", torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.dim() == dims, "decode_step: ", name, " must have ", dims, " dimensions, got ",
                  t.dim());
  STD_TORCH_CHECK(t.is_contiguous(), "decode_step: ", name, " must be contiguous");
  STD_TORCH_CHECK(t.is_cpu(), "decode_step: ", name, " must be a CPU tensor");
}

void check_shape(const Tensor& t, const char* name, int64_t i, int64_t rows, int64_t cols) {
  const bool ok = cols < 0 ? t.size(0) == rows : (t.size(0) == rows && t.size(1) == cols);
  STD_TORCH_CHECK(ok, "decode_step: ", name, "[", i, "] must be [", rows, cols < 0 ? "" : ", ",
                  cols < 0 ? "" : std::to_string(cols), "]");
}

// out = x @ w^T (+ bias): x [B, K], w [N, K] (nn.Linear's layout), out [B, N].
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  const AOTITorchError err =
      bias != nullptr
          ? aoti_torch_cpu_addmm_out(out.get(), bias->get(), x.get(), transposed(w).get(), 1.0, 1.0)
          : aoti_torch_cpu_mm_out(out.get(), x.get(), transposed(w).get());
  STD_TORCH_CHECK(err == AOTI_TORCH_SUCCESS, "decode_step: matrix product failed");
}

void rms_norm(float* out, const float* x, const float* weight, int64_t B, int64_t H, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * H;
    float sum = 0.0f;
    for (int64_t j = 0; j < H; ++j) sum += xb[j] * xb[j];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j) out[b * H + j] = weight[j] * (xb[j] * scale);
  }
}

// In place on one head's D values: x * cos + roll(x, D/2) * signed sin.
void rotate(float* x, const float* cos, const float* sin, int64_t D, float* scratch) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) scratch[d] = x[d];
  for (int64_t d = 0; d < D; ++d) {
    const float rolled = scratch[d < half ? d + half : d - half];
    x[d] = scratch[d] * cos[d] + rolled * sin[d];
  }
}

}  // namespace

Tensor decode_step_cpu(Tensor token, Tensor position, Tensor slot, Tensor slot_mask, Tensor embed,
                       std::vector<Tensor> input_norm, std::vector<Tensor> qkv_weight,
                       std::vector<Tensor> qkv_bias, std::vector<Tensor> o_weight,
                       std::vector<Tensor> post_norm, std::vector<Tensor> gate_up_weight,
                       std::vector<Tensor> down_weight, Tensor final_norm, Tensor lm_head,
                       Tensor cos, Tensor sin, Tensor keys, Tensor values, int64_t num_heads,
                       int64_t kv_heads, double eps) {
  const int64_t L = static_cast<int64_t>(input_norm.size());
  STD_TORCH_CHECK(L >= 1, "decode_step: at least one layer");
  STD_TORCH_CHECK(static_cast<int64_t>(qkv_weight.size()) == L &&
                      static_cast<int64_t>(o_weight.size()) == L &&
                      static_cast<int64_t>(post_norm.size()) == L &&
                      static_cast<int64_t>(gate_up_weight.size()) == L &&
                      static_cast<int64_t>(down_weight.size()) == L &&
                      (qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == L),
                  "decode_step: every per-layer list must have ", L, " entries");
  STD_TORCH_CHECK(token.scalar_type() == ScalarType::Long && token.dim() == 1,
                  "decode_step: token must be int64 [B]");
  const int64_t B = token.size(0);
  STD_TORCH_CHECK(
      position.scalar_type() == ScalarType::Long && position.dim() == 1 && position.size(0) == B,
      "decode_step: position must be int64 [B]");
  STD_TORCH_CHECK(slot.scalar_type() == ScalarType::Long && slot.numel() == 1,
                  "decode_step: slot must be a one-element int64 tensor");
  check_float(embed, "embed", 2);
  check_float(lm_head, "lm_head", 2);
  check_float(final_norm, "final_norm", 1);
  check_float(cos, "cos", 2);
  check_float(sin, "sin", 2);
  check_float(keys, "keys", 5);
  check_float(values, "values", 5);
  STD_TORCH_CHECK(token.is_cpu() && position.is_cpu() && slot.is_cpu() && slot_mask.is_cpu(),
                  "decode_step: token, position, slot and slot_mask must be CPU tensors");
  const int64_t V = embed.size(0), H = embed.size(1), D = keys.size(4), S = keys.size(3);
  STD_TORCH_CHECK(num_heads >= 1 && kv_heads >= 1 && num_heads % kv_heads == 0,
                  "decode_step: num_heads must be a multiple of kv_heads");
  STD_TORCH_CHECK(D % 2 == 0, "decode_step: the head dimension must be even");
  STD_TORCH_CHECK(keys.size(0) == L && keys.size(1) == B && keys.size(2) == kv_heads,
                  "decode_step: keys must be [L, B, kv_heads, S, D] = [", L, ", ", B, ", ",
                  kv_heads, ", S, D]");
  for (int64_t d = 0; d < 5; ++d) {
    STD_TORCH_CHECK(values.size(d) == keys.size(d), "decode_step: values must match keys");
  }
  STD_TORCH_CHECK(slot_mask.scalar_type() == ScalarType::Bool && slot_mask.dim() == 2 &&
                      slot_mask.size(0) == B && slot_mask.size(1) == S && slot_mask.is_contiguous(),
                  "decode_step: slot_mask must be a contiguous bool [B, S] = [", B, ", ", S, "]");
  STD_TORCH_CHECK(lm_head.size(1) == H && final_norm.size(0) == H,
                  "decode_step: lm_head must be [V, H] and final_norm [H], H = ", H);
  STD_TORCH_CHECK(cos.size(1) == D && sin.size(1) == D && sin.size(0) == cos.size(0),
                  "decode_step: cos and sin must be [positions, D], D = ", D);
  const int64_t Q = (num_heads + 2 * kv_heads) * D;
  int64_t I = -1;
  for (int64_t l = 0; l < L; ++l) {
    check_float(input_norm[l], "input_norm", 1);
    check_float(post_norm[l], "post_norm", 1);
    check_float(qkv_weight[l], "qkv_weight", 2);
    check_float(o_weight[l], "o_weight", 2);
    check_float(gate_up_weight[l], "gate_up_weight", 2);
    check_float(down_weight[l], "down_weight", 2);
    check_shape(input_norm[l], "input_norm", l, H, -1);
    check_shape(post_norm[l], "post_norm", l, H, -1);
    check_shape(qkv_weight[l], "qkv_weight", l, Q, H);
    check_shape(o_weight[l], "o_weight", l, H, num_heads * D);
    if (I < 0) I = gate_up_weight[l].size(0) / 2;
    check_shape(gate_up_weight[l], "gate_up_weight", l, 2 * I, H);
    check_shape(down_weight[l], "down_weight", l, H, I);
    if (!qkv_bias.empty()) {
      check_float(qkv_bias[l], "qkv_bias", 1);
      check_shape(qkv_bias[l], "qkv_bias", l, Q, -1);
    }
  }
  const int64_t s = slot.const_data_ptr<int64_t>()[0];  // a CPU tensor: no device read
  STD_TORCH_CHECK(s >= 0 && s < S, "decode_step: slot ", s, " outside [0, ", S, ")");
  const int64_t* tok = token.const_data_ptr<int64_t>();
  const int64_t* pos = position.const_data_ptr<int64_t>();
  const int64_t P = cos.size(0);
  for (int64_t b = 0; b < B; ++b) {
    STD_TORCH_CHECK(tok[b] >= 0 && tok[b] < V, "decode_step: token ", tok[b], " outside [0, ", V,
                    ")");
    STD_TORCH_CHECK(pos[b] >= 0 && pos[b] < P, "decode_step: position ", pos[b], " outside [0, ", P,
                    ")");
  }

  Tensor x = new_contiguous(embed, {B, H});
  Tensor h = new_contiguous(embed, {B, H});
  Tensor tmp = new_contiguous(embed, {B, H});
  Tensor qkv = new_contiguous(embed, {B, Q});
  Tensor att = new_contiguous(embed, {B, num_heads * D});
  Tensor gate_up = new_contiguous(embed, {B, 2 * I});
  Tensor act = new_contiguous(embed, {B, I});
  Tensor logits = new_contiguous(embed, {B, V});
  float* xp = x.mutable_data_ptr<float>();
  const float* ep = embed.const_data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < H; ++j) xp[b * H + j] = ep[tok[b] * H + j];
  }
  const bool* mask = slot_mask.const_data_ptr<bool>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t groups = num_heads / kv_heads;
  const float feps = static_cast<float>(eps);
  std::vector<float> scratch(static_cast<size_t>(D)), scores(static_cast<size_t>(S));
  float* kc = keys.mutable_data_ptr<float>();
  float* vc = values.mutable_data_ptr<float>();
  for (int64_t l = 0; l < L; ++l) {
    rms_norm(h.mutable_data_ptr<float>(), xp, input_norm[l].const_data_ptr<float>(), B, H, feps);
    linear(qkv, h, qkv_weight[l], qkv_bias.empty() ? nullptr : &qkv_bias[l]);
    float* qp = qkv.mutable_data_ptr<float>();
    float* ap = att.mutable_data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      float* row = qp + b * Q;
      const float* c = cp + pos[b] * D;
      const float* sn = sp + pos[b] * D;
      for (int64_t head = 0; head < num_heads + kv_heads; ++head) {
        rotate(row + head * D, c, sn, D, scratch.data());
      }
      // The new key and value into the cache at slot s.
      for (int64_t kh = 0; kh < kv_heads; ++kh) {
        const int64_t base = (((l * B + b) * kv_heads + kh) * S + s) * D;
        for (int64_t d = 0; d < D; ++d) {
          kc[base + d] = row[(num_heads + kh) * D + d];
          vc[base + d] = row[(num_heads + kv_heads + kh) * D + d];
        }
      }
      const bool* mb = mask + b * S;
      for (int64_t head = 0; head < num_heads; ++head) {
        const float* q = row + head * D;
        const int64_t kh = head / groups;
        const float* kbase = kc + ((l * B + b) * kv_heads + kh) * S * D;
        const float* vbase = vc + ((l * B + b) * kv_heads + kh) * S * D;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < S; ++t) {
          if (!mb[t]) continue;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * kbase[t * D + d];
          scores[t] = dot * scale;
          m = scores[t] > m ? scores[t] : m;
        }
        float total = 0.0f;
        for (int64_t t = 0; t < S; ++t) {
          if (!mb[t]) continue;
          scores[t] = std::exp(scores[t] - m);
          total += scores[t];
        }
        float* out = ap + b * num_heads * D + head * D;
        for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
        for (int64_t t = 0; t < S; ++t) {
          if (!mb[t]) continue;
          const float p = scores[t] / total;
          for (int64_t d = 0; d < D; ++d) out[d] += p * vbase[t * D + d];
        }
      }
    }
    linear(tmp, att, o_weight[l], nullptr);
    const float* tp = tmp.const_data_ptr<float>();
    for (int64_t i = 0; i < B * H; ++i) xp[i] += tp[i];
    rms_norm(h.mutable_data_ptr<float>(), xp, post_norm[l].const_data_ptr<float>(), B, H, feps);
    linear(gate_up, h, gate_up_weight[l], nullptr);
    const float* gu = gate_up.const_data_ptr<float>();
    float* a = act.mutable_data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < I; ++i) {
        const float g = gu[b * 2 * I + i];
        a[b * I + i] = g / (1.0f + std::exp(-g)) * gu[b * 2 * I + I + i];
      }
    }
    linear(tmp, act, down_weight[l], nullptr);
    for (int64_t i = 0; i < B * H; ++i) xp[i] += tp[i];
  }
  rms_norm(h.mutable_data_ptr<float>(), xp, final_norm.const_data_ptr<float>(), B, H, feps);
  linear(logits, h, lm_head, nullptr);
  return logits;
}

}  // namespace nostall
