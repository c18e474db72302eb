// CPU loops of decoder_train's attention (see decoder_attention.h), AVX2 clones where the CPU has
// AVX2 (decoder_core.h).
#include "ops/decoder_attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/decoder_core.h"

namespace nostall::decoder {

namespace {

// The loops with the head dimension known at compile time (kD > 0; 0: D at run time): dot and
// axpy over a constant D unroll into a few vector instructions, where a run-time D paid a loop
// and its remainder checks per key slot, most of the attention's time at D = 16. Inlined into
// each clone below, so each is compiled for that clone's target.
template <int64_t kD>
NOSTALL_ALWAYS_INLINE inline void attention_forward_rows(const float* qkv, const int64_t* key_row,
                                                         int64_t N, int64_t K, int64_t Q,
                                                         int64_t heads, int64_t kv, int64_t any_d,
                                                         float scale, float* probs, float* att) {
  const int64_t D = kD > 0 ? kD : any_d;
  const int64_t groups = heads / kv, A = heads * D;
  for (int64_t n = 0; n < N; ++n) {
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

template <int64_t kD>
NOSTALL_ALWAYS_INLINE inline void attention_backward_rows(const float* qkv, const float* probs,
                                                          const float* datt, const int64_t* key_row,
                                                          int64_t N, int64_t K, int64_t Q,
                                                          int64_t heads, int64_t kv, int64_t any_d,
                                                          float scale, float* dqkv, float* dp) {
  const int64_t D = kD > 0 ? kD : any_d;
  const int64_t groups = heads / kv, A = heads * D;
  std::memset(dqkv, 0, sizeof(float) * N * Q);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* keys = key_row + n * K;
    for (int64_t head = 0; head < heads; ++head) {
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

}  // namespace

NOSTALL_AVX2_CLONES void attention_forward(const float* qkv, const int64_t* key_row, int64_t N,
                                           int64_t K, int64_t Q, int64_t heads, int64_t kv,
                                           int64_t D, float scale, float* probs, float* att) {
  switch (D) {
    case 16:
      return attention_forward_rows<16>(qkv, key_row, N, K, Q, heads, kv, D, scale, probs, att);
    case 32:
      return attention_forward_rows<32>(qkv, key_row, N, K, Q, heads, kv, D, scale, probs, att);
    case 64:
      return attention_forward_rows<64>(qkv, key_row, N, K, Q, heads, kv, D, scale, probs, att);
    case 128:
      return attention_forward_rows<128>(qkv, key_row, N, K, Q, heads, kv, D, scale, probs, att);
    default:
      return attention_forward_rows<0>(qkv, key_row, N, K, Q, heads, kv, D, scale, probs, att);
  }
}

NOSTALL_AVX2_CLONES void attention_backward(const float* qkv, const float* probs, const float* datt,
                                            const int64_t* key_row, int64_t N, int64_t K, int64_t Q,
                                            int64_t heads, int64_t kv, int64_t D, float scale,
                                            float* dqkv, float* dp) {
  switch (D) {
    case 16:
      return attention_backward_rows<16>(qkv, probs, datt, key_row, N, K, Q, heads, kv, D, scale,
                                         dqkv, dp);
    case 32:
      return attention_backward_rows<32>(qkv, probs, datt, key_row, N, K, Q, heads, kv, D, scale,
                                         dqkv, dp);
    case 64:
      return attention_backward_rows<64>(qkv, probs, datt, key_row, N, K, Q, heads, kv, D, scale,
                                         dqkv, dp);
    case 128:
      return attention_backward_rows<128>(qkv, probs, datt, key_row, N, K, Q, heads, kv, D, scale,
                                          dqkv, dp);
    default:
      return attention_backward_rows<0>(qkv, probs, datt, key_row, N, K, Q, heads, kv, D, scale,
                                        dqkv, dp);
  }
}

}  // namespace nostall::decoder
