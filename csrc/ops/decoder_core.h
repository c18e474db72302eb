// What the native decoder ops (decode_step, prefill_prompts, decoder_train) share: the checks on a
// Llama-family decoder's weights and KV cache, and the layer loop (RMSNorm, fused q/k/v projection,
// an attention the op supplies, output projection, RMSNorm, SiLU-gated MLP) over a residual stream
// of N rows. GEMMs go through the C shim's addmm / mm; everything between them is plain loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "common/checks.h"
#include "ops/decoder_weights.h"

// An x86-64-v3 clone (AVX2 and FMA) of a per-token loop, chosen once at load where the CPU has
// them (the library is built for baseline x86-64), its multiplies and adds fused (fp-contract:
// the attention's dot products and updates, about 5% of the update's backward).
// The ThreadSanitizer build goes without (tools/sanitize.sh defines NOSTALL_NO_CLONES): the
// clones' resolvers run while the library is being relocated, before the instrumented calls they
// make can be resolved, and the load crashes.
#if defined(NOSTALL_NO_CLONES)
#define NOSTALL_AVX2_CLONES
#else
#define NOSTALL_AVX2_CLONES \
  __attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
#endif
// A helper inlined into its (cloned) caller, so it is compiled for each clone's target.
#define NOSTALL_ALWAYS_INLINE __attribute__((always_inline))

namespace nostall::decoder {

// A decoder's weights are float32 or bfloat16 (all the same); its activations, rotary tables and
// KV cache are float32 either way. With bf16 weights the matrix products take their float32
// operands rounded to bf16 and give float32 results (a bf16 GEMM accumulates in float32), and the
// norms' weights are widened once per call: the loops between the GEMMs are the float32 ones.
// Hidden, as the stable ABI's Tensor it holds is: a struct more visible than its fields draws
// -Wattributes (it never crosses the library's boundary).
// (Its LayerWeights' input_norm, post_norm and final_norm: float32, widened from bf16 weights.)
struct __attribute__((visibility("hidden"))) Weights : LayerWeights {
  Tensor lm_head, cos, sin;
  int64_t layers = 0, vocab = 0, hidden = 0, qkv_width = 0, intermediate = 0, head_dim = 0;
  int64_t num_heads = 0, kv_heads = 0, slots = 0, cache_rows = 0;
  float eps = 0.0f;
  bool bf16 = false;  // the weights' dtype (else float32)
};

// Checks every layer weight and the final norm (contiguous, CPU, float32 or bfloat16 as embed is,
// the shapes a decoder's layers need) and the rotary tables (float32; the head dimension is their
// width); `op` prefixes every message. lm_head and the cache fields stay empty.
Weights check_layers(const char* op, LayerWeights weights, Tensor cos, Tensor sin,
                     int64_t num_heads, int64_t kv_heads, double eps);

// check_layers, then the output weight lm_head [V, H] (embed's dtype) and the float32 cache
// (keys, values [L, rows, kv_heads, S, D]).
Weights check(const char* op, LayerWeights weights, Tensor lm_head, Tensor cos, Tensor sin,
              const Tensor& keys, const Tensor& values, int64_t num_heads, int64_t kv_heads,
              double eps);

// Fills x [N, H] (float32) with the embeddings of tokens[0..N).
void embed_tokens(const Weights& w, const int64_t* tokens, int64_t N, Tensor& x);

// row[0..H) = embedding row `token` as floats.
void embedding_row(const Weights& w, int64_t token, float* row);

// bf16 <-> float32 bit patterns: bf16 is the top half of a float32; the narrowing rounds to
// nearest even, as torch's cast does (NaNs stay NaNs).
NOSTALL_ALWAYS_INLINE inline float widen_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

NOSTALL_ALWAYS_INLINE inline uint16_t narrow_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;  // (branch-free, so loops vectorize)
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// t converted to float32 / to the dtype of `like` (t itself where it already is): a contiguous
// copy through the C shim.
Tensor as_float(const Tensor& t);
Tensor cast_like(const Tensor& t, const Tensor& like);

// Runs every layer over the residual stream x [N, H] in place. After layer l's q/k/v projection,
// attend(l, qkv, att) gets qkv [N, (heads + 2 kv_heads) D] (unrotated, writable) and must fill
// att [N, heads D] with the attention output.
using Attend = std::function<void(int64_t layer, float* qkv, float* att)>;
void run_layers(const Weights& w, Tensor& x, const Attend& attend);

// out = x @ w^T (+ bias): x [N, K], w [M, K] (nn.Linear's layout), out [N, M]. x and out may be
// float32 over bf16 weights (a bf16 GEMM between casts).
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias);

// out = a @ b (either may be a strided view, e.g. a transpose). Where the three dtypes differ
// (float32 and bf16), the product is taken in bf16 and cast to out's dtype.
void mm(Tensor& out, const Tensor& a, const Tensor& b);

// out += a @ b in out's dtype (the operands cast to it).
void mm_add(Tensor& out, const Tensor& a, const Tensor& b);

// act [N, I] = silu(gate) * up of gate_up [N, 2I]; scratch [I]. (An AVX2 clone where the CPU
// has it, chosen once at load.)
void silu_gate(const float* gate_up, float* act, int64_t N, int64_t I, float* scratch);

// out [N, H] = weight * x / rms(x), row by row.
void rms_norm(float* out, const float* x, const float* weight, int64_t N, int64_t H, float eps);

// e^x to within about 1e-7 relative (Cephes' expf: x = n ln2 + r, a degree-6 polynomial for
// e^r, 2^n from the exponent bits), branch-free so loops over it vectorize, where std::exp is a
// libm call per element: the SiLU's exps were half of a small model's prefill.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float shifted = x * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23: round to int
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln 2 in two parts, so r keeps its low bits
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// logits [N, V] of x [N, H] after the final RMSNorm.
Tensor logits(const Weights& w, const Tensor& x);

// a . b over n floats, in eight interleaved partial sums: one running sum is a chain the
// compiler may not reorder, so it would stay scalar; these vectorize (a different rounding order).
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int64_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// Eight floats in one value (GCC's vector extension): one AVX2 register in an x86-64-v3 clone,
// two SSE registers in the default one. The attention's loops at a head size known at compile
// time use these: written as scalar loops over D = 16, GCC left every multiply scalar there.
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));

NOSTALL_ALWAYS_INLINE inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));  // (unaligned: one vmovups)
  return v;
}

NOSTALL_ALWAYS_INLINE inline void store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof(v)); }

// The sum of the lanes in dot's order: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)).
NOSTALL_ALWAYS_INLINE inline float sum8(Vec8 a) {
  const Vec4 s =
      __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// out[0..n) += s * x[0..n).
inline void axpy(float* __restrict out, float s, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += s * x[i];
}

// In place on one head's D values: x * cos + roll(x, D/2) * signed sin, pair by pair (element
// d and d + D/2 read each other), so no copy is needed.
inline void rotate(float* __restrict x, const float* __restrict cos, const float* __restrict sin,
                   int64_t D) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float a = x[d], b = x[d + half];
    x[d] = a * cos[d] + b * sin[d];
    x[d + half] = b * cos[d + half] + a * sin[d + half];
  }
}

// out[D] = sum over the allowed slots t of softmax_t(q . k_t * scale) v_t: one query of one head
// over that head's keys and values [S, D]; allowed [S] (at least one true), scores [S] scratch.
void attend_one(const float* q, const float* keys, const float* values, int64_t S, int64_t D,
                float scale, const bool* allowed, float* scores, float* out);

}  // namespace nostall::decoder
