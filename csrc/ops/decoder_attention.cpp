// CPU loops of decoder_train's attention (see decoder_attention.h), AVX2 clones where the CPU has
// AVX2 (decoder_core.h).
#include "ops/decoder_attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/decoder_core.h"

namespace nostall::decoder {

namespace {

// The loops at any head size D (the vector loops below take the usual ones). Inlined into each
// clone below, so each is compiled for that clone's target.
NOSTALL_ALWAYS_INLINE inline void attention_forward_rows(const float* qkv, const int64_t* key_row,
                                                         int64_t first, int64_t N, int64_t K,
                                                         int64_t Q, int64_t heads, int64_t kv,
                                                         int64_t D, float scale, float* probs,
                                                         float* att) {
  const int64_t groups = heads / kv, A = heads * D;
  for (int64_t n = first; n < N; ++n) {
    const int64_t* keys = key_row + n * K;
    for (int64_t head = 0; head < heads; ++head) {
      const float* q = qkv + n * Q + head * D;
      const int64_t kh = head / groups;
      float* pr = probs + (n * heads + head) * K;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < K; ++s) {
        if (keys[s] < 0) continue;
        pr[s] = dot(q, qkv + keys[s] * Q + (heads + kh) * D, D) * scale;
        m = pr[s] > m ? pr[s] : m;
      }
      float total = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        pr[s] =
            keys[s] < 0 ? 0.0f : fast_exp(pr[s] - m);  // (a libm call each: a third of the loop)
        total += pr[s];
      }
      float* out = att + n * A + head * D;
      for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        pr[s] /= total;
        if (keys[s] >= 0) axpy(out, pr[s], qkv + keys[s] * Q + (heads + kv + kh) * D, D);
      }
    }
  }
}

NOSTALL_ALWAYS_INLINE inline void attention_backward_rows(const float* qkv, const float* probs,
                                                          const float* datt, const int64_t* key_row,
                                                          int64_t first, int64_t N, int64_t K,
                                                          int64_t Q, int64_t heads, int64_t kv,
                                                          int64_t D, float scale, int64_t kv_first,
                                                          int64_t kv_last, float* dqkv, float* dp) {
  const int64_t groups = heads / kv, A = heads * D;
  for (int64_t n = first; n < N; ++n) {
    const int64_t* keys = key_row + n * K;
    for (int64_t head = kv_first * groups; head < kv_last * groups; ++head) {
      const int64_t kh = head / groups;
      const float* q = qkv + n * Q + head * D;
      const float* pr = probs + (n * heads + head) * K;
      const float* dout = datt + n * A + head * D;
      float weighted = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        dp[s] = 0.0f;
        if (keys[s] < 0) continue;
        dp[s] = dot(dout, qkv + keys[s] * Q + (heads + kv + kh) * D, D);
        weighted += pr[s] * dp[s];
      }
      float* dqh = dqkv + n * Q + head * D;
      for (int64_t s = 0; s < K; ++s) {
        if (keys[s] < 0) continue;
        const float ds = pr[s] * (dp[s] - weighted) * scale;
        const int64_t row = keys[s] * Q;
        axpy(dqh, ds, qkv + row + (heads + kh) * D, D);
        axpy(dqkv + row + (heads + kh) * D, ds, q, D);
        axpy(dqkv + row + (heads + kv + kh) * D, pr[s], dout, D);
      }
    }
  }
}

// The same loops with the head dimension a known multiple of 8, kV vectors of 8 (Vec8): the
// query (or the output's gradient) stays in registers across a row's key slots, and each slot
// is kV multiply-adds and one sum of lanes, where the scalar loops above were 4 * kV times as
// many instructions. Sums run in the scalar loops' order (dot's lanes, then slot by slot).
template <int64_t kV>
NOSTALL_ALWAYS_INLINE inline void attention_forward_vec(const float* qkv, const int64_t* key_row,
                                                        int64_t first, int64_t N, int64_t K,
                                                        int64_t Q, int64_t heads, int64_t kv,
                                                        float scale, float* probs, float* att) {
  constexpr int64_t D = 8 * kV;
  const int64_t groups = heads / kv, A = heads * D;
  for (int64_t n = first; n < N; ++n) {
    const int64_t* keys = key_row + n * K;
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t kh = head / groups;
      const float* keys_at = qkv + (heads + kh) * D;
      const float* values_at = qkv + (heads + kv + kh) * D;
      Vec8 q[kV];
      for (int64_t v = 0; v < kV; ++v) q[v] = load8(qkv + n * Q + head * D + 8 * v);
      float* pr = probs + (n * heads + head) * K;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < K; ++s) {
        if (keys[s] < 0) continue;
        const float* k = keys_at + keys[s] * Q;
        Vec8 acc = q[0] * load8(k);
        for (int64_t v = 1; v < kV; ++v) acc += q[v] * load8(k + 8 * v);
        pr[s] = sum8(acc) * scale;
        m = pr[s] > m ? pr[s] : m;
      }
      float total = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        pr[s] = keys[s] < 0 ? 0.0f : fast_exp(pr[s] - m);
        total += pr[s];
      }
      Vec8 out[kV] = {};
      for (int64_t s = 0; s < K; ++s) {
        pr[s] /= total;
        if (keys[s] < 0) continue;
        const float* value = values_at + keys[s] * Q;
        for (int64_t v = 0; v < kV; ++v) out[v] += pr[s] * load8(value + 8 * v);
      }
      for (int64_t v = 0; v < kV; ++v) store8(att + n * A + head * D + 8 * v, out[v]);
    }
  }
}

template <int64_t kV>
NOSTALL_ALWAYS_INLINE inline void attention_backward_vec(const float* qkv, const float* probs,
                                                         const float* datt, const int64_t* key_row,
                                                         int64_t first, int64_t N, int64_t K,
                                                         int64_t Q, int64_t heads, int64_t kv,
                                                         float scale, int64_t kv_first,
                                                         int64_t kv_last, float* dqkv, float* dp) {
  constexpr int64_t D = 8 * kV;
  const int64_t groups = heads / kv, A = heads * D;
  for (int64_t n = first; n < N; ++n) {
    const int64_t* keys = key_row + n * K;
    for (int64_t head = kv_first * groups; head < kv_last * groups; ++head) {
      const int64_t kh = head / groups;
      const int64_t key_at = (heads + kh) * D, value_at = (heads + kv + kh) * D;
      const float* pr = probs + (n * heads + head) * K;
      Vec8 q[kV], dout[kV], dq[kV] = {};
      for (int64_t v = 0; v < kV; ++v) {
        q[v] = load8(qkv + n * Q + head * D + 8 * v);
        dout[v] = load8(datt + n * A + head * D + 8 * v);
      }
      float weighted = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        dp[s] = 0.0f;
        if (keys[s] < 0) continue;
        const float* value = qkv + keys[s] * Q + value_at;
        Vec8 acc = dout[0] * load8(value);
        for (int64_t v = 1; v < kV; ++v) acc += dout[v] * load8(value + 8 * v);
        dp[s] = sum8(acc);
        weighted += pr[s] * dp[s];
      }
      for (int64_t s = 0; s < K; ++s) {
        if (keys[s] < 0) continue;
        const float ds = pr[s] * (dp[s] - weighted) * scale;
        const float* key = qkv + keys[s] * Q + key_at;
        float* dkey = dqkv + keys[s] * Q + key_at;
        float* dvalue = dqkv + keys[s] * Q + value_at;
        for (int64_t v = 0; v < kV; ++v) {
          dq[v] += ds * load8(key + 8 * v);
          store8(dkey + 8 * v, load8(dkey + 8 * v) + ds * q[v]);
          store8(dvalue + 8 * v, load8(dvalue + 8 * v) + pr[s] * dout[v]);
        }
      }
      // (Row n's query columns take no other row's terms: the sum is complete.)
      for (int64_t v = 0; v < kV; ++v) store8(dqkv + n * Q + head * D + 8 * v, dq[v]);
    }
  }
}

}  // namespace

NOSTALL_AVX2_CLONES void attention_forward(const float* qkv, const int64_t* key_row, int64_t first,
                                           int64_t N, int64_t K, int64_t Q, int64_t heads,
                                           int64_t kv, int64_t D, float scale, float* probs,
                                           float* att) {
  switch (D) {
    case 16:
      return attention_forward_vec<2>(qkv, key_row, first, N, K, Q, heads, kv, scale, probs, att);
    case 32:
      return attention_forward_vec<4>(qkv, key_row, first, N, K, Q, heads, kv, scale, probs, att);
    case 64:
      return attention_forward_vec<8>(qkv, key_row, first, N, K, Q, heads, kv, scale, probs, att);
    case 128:
      return attention_forward_vec<16>(qkv, key_row, first, N, K, Q, heads, kv, scale, probs, att);
    default:
      return attention_forward_rows(qkv, key_row, first, N, K, Q, heads, kv, D, scale, probs, att);
  }
}

NOSTALL_AVX2_CLONES void attention_backward(const float* qkv, const float* probs, const float* datt,
                                            const int64_t* key_row, int64_t first, int64_t N,
                                            int64_t K, int64_t Q, int64_t heads, int64_t kv,
                                            int64_t D, float scale, int64_t kv_first,
                                            int64_t kv_last, float* dqkv, float* dp) {
  switch (D) {
    case 16:
      return attention_backward_vec<2>(qkv, probs, datt, key_row, first, N, K, Q, heads, kv, scale,
                                       kv_first, kv_last, dqkv, dp);
    case 32:
      return attention_backward_vec<4>(qkv, probs, datt, key_row, first, N, K, Q, heads, kv, scale,
                                       kv_first, kv_last, dqkv, dp);
    case 64:
      return attention_backward_vec<8>(qkv, probs, datt, key_row, first, N, K, Q, heads, kv, scale,
                                       kv_first, kv_last, dqkv, dp);
    case 128:
      return attention_backward_vec<16>(qkv, probs, datt, key_row, first, N, K, Q, heads, kv, scale,
                                        kv_first, kv_last, dqkv, dp);
    default:
      return attention_backward_rows(qkv, probs, datt, key_row, first, N, K, Q, heads, kv, D, scale,
                                     kv_first, kv_last, dqkv, dp);
  }
}

}  // namespace nostall::decoder
