// The row kernels of cpu_rows.h for a vector width W, in GCC / Clang vector extensions.
// Included by one translation unit per instruction set, so it must not pull in headers whose
// inline functions the linker could share across them (an AVX2 copy chosen for a baseline
// caller would crash a CPU without AVX2): everything here has internal linkage and uses
// builtins only.
//
// exp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, then a degree-7 Taylor polynomial
// (truncation below 6e-9 relative); within 2 ulp of expf down to -87.3, exactly 0 below (so
// masked -inf logits contribute nothing), +inf past FLT_MAX, NaN for NaN.
#pragma once

#include <cstdint>

#include "ops/cpu_rows.h"

namespace nostall::rows {
namespace {

// Vector types of W lanes (spelled out per width: GCC drops vector_size on dependent sizes).
template <int W>
struct Lanes;
template <>
struct Lanes<4> {
  typedef float f32 __attribute__((vector_size(16)));
  typedef int32_t i32 __attribute__((vector_size(16)));
  typedef uint32_t u32 __attribute__((vector_size(16)));
  typedef uint16_t u16 __attribute__((vector_size(8)));
  typedef uint8_t u8 __attribute__((vector_size(4)));
};
template <>
struct Lanes<8> {
  typedef float f32 __attribute__((vector_size(32)));
  typedef int32_t i32 __attribute__((vector_size(32)));
  typedef uint32_t u32 __attribute__((vector_size(32)));
  typedef uint16_t u16 __attribute__((vector_size(16)));
  typedef uint8_t u8 __attribute__((vector_size(8)));
};

template <int W>
struct Vec {
  using f32 = typename Lanes<W>::f32;
  using i32 = typename Lanes<W>::i32;
  using u32 = typename Lanes<W>::u32;
  using u16 = typename Lanes<W>::u16;
  using u8 = typename Lanes<W>::u8;

  static f32 splat(float x) { return f32{} + x; }

  static f32 load(const float* p) {
    f32 v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
  }

  // bfloat16 is the high half of a float32: widening is a shift.
  static f32 load(const uint16_t* p) {
    u16 half;
    __builtin_memcpy(&half, p, sizeof(half));
    const u32 bits = __builtin_convertvector(half, u32) << 16;
    f32 v;
    __builtin_memcpy(&v, &bits, sizeof(v));
    return v;
  }

  // A lane mask (all ones where the byte is non-zero) from W bool bytes.
  static i32 load_mask(const uint8_t* p) {
    u8 bytes;
    __builtin_memcpy(&bytes, p, sizeof(bytes));
    return __builtin_convertvector(bytes, i32) != 0;
  }

  static void store(float* p, f32 v) { __builtin_memcpy(p, &v, sizeof(v)); }

  // Round to nearest even, as torch does; NaN stays NaN.
  static void store(uint16_t* p, f32 v) {
    u32 bits;
    __builtin_memcpy(&bits, &v, sizeof(bits));
    u32 rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    rounded = (v != v) ? u32{} + 0x7FC0u : rounded;
    const u16 half = __builtin_convertvector(rounded, u16);
    __builtin_memcpy(p, &half, sizeof(half));
  }

  static f32 exp(f32 x) {
    constexpr float kMin = -87.3f;        // below: 0 (exp would be subnormal)
    constexpr float kMax = 88.72283905f;  // above: +inf (exp would pass FLT_MAX)
    const i32 underflow = x < kMin;
    const i32 overflow = x > kMax;
    f32 y = x < kMin ? splat(kMin) : x;
    y = y > kMax ? splat(kMax) : y;
    const f32 n = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // in [-126, 128]
    const f32 r = (y - n * 0.693359375f) - n * -2.12194440e-4f;
    f32 p = splat(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    // 2^n from the exponent bits; 2^128 is not a float, so n = 128 is 2^127 * 2.
    const i32 top = n > 127.5f;
    const f32 n_low = top ? splat(127.0f) : n;
    const i32 bits = (__builtin_convertvector(n_low, i32) + 127) << 23;
    f32 scale;
    __builtin_memcpy(&scale, &bits, sizeof(scale));
    const f32 out = p * scale * (top ? splat(2.0f) : splat(1.0f));
    return underflow ? splat(0.0f) : (overflow ? splat(__builtin_inff()) : out);
  }

  static f32 max(f32 a, f32 b) { return b > a ? b : a; }

  // tanh as Cephes' tanhf computes it: for |x| > 0.625, 1 - 2 / (exp(2|x|) + 1) (no
  // cancellation there; exp's +inf past 44 gives exactly 1), else an odd degree-11 polynomial;
  // the sign restored from x's sign bit. NaN stays NaN (it takes the polynomial branch).
  static f32 tanh(f32 x) {
    u32 bits;
    __builtin_memcpy(&bits, &x, sizeof(bits));
    const u32 sign = bits & 0x80000000u;
    const u32 abs_bits = bits & 0x7FFFFFFFu;
    f32 a;
    __builtin_memcpy(&a, &abs_bits, sizeof(a));
    const f32 large = 1.0f - 2.0f / (exp(a + a) + 1.0f);
    const f32 z = a * a;
    f32 p = splat(-5.70498872745e-3f);
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const f32 small = p * z * a + a;
    const f32 r = a > 0.625f ? large : small;
    u32 out;
    __builtin_memcpy(&out, &r, sizeof(out));
    out |= sign;
    f32 y;
    __builtin_memcpy(&y, &out, sizeof(y));
    return y;
  }
};

// The last V % W elements go through the same vector code, via a W-lane buffer padded with
// -inf (which changes neither the max nor the sum: exp(-inf) is 0).
template <int W, typename T>
struct Tail {
  T buf[W];
  Tail(const T* x, int64_t n) {
    for (int64_t i = 0; i < W; ++i) buf[i] = i < n ? x[i] : minus_inf();
  }
  static T minus_inf() {
    if constexpr (sizeof(T) == 2) {
      return 0xFF80u;  // bfloat16 -inf
    } else {
      return -__builtin_inff();
    }
  }
};

template <int W, typename T>
float logsumexp_row(const T* __restrict__ x, int64_t V) {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  const int64_t full = V - V % W;
  const Tail<W, T> tail(x + full, V - full);
  int64_t v = 0;
  f32 m0 = V_::splat(-__builtin_inff()), m1 = m0, m2 = m0, m3 = V_::load(tail.buf);
  for (; v + 3 * W <= full; v += 3 * W) {  // independent accumulators hide each op's latency
    m0 = V_::max(m0, V_::load(x + v));
    m1 = V_::max(m1, V_::load(x + v + W));
    m2 = V_::max(m2, V_::load(x + v + 2 * W));
  }
  for (; v < full; v += W) m0 = V_::max(m0, V_::load(x + v));
  // NaN is skipped by the max but reaches the sum: a row with NaN has a NaN result.
  const f32 mv = V_::max(V_::max(m0, m1), V_::max(m2, m3));
  float m = mv[0];
  for (int i = 1; i < W; ++i) m = mv[i] > m ? mv[i] : m;

  const f32 ms = V_::splat(m);
  f32 s0 = V_::splat(0.0f), s1 = s0, s2 = s0, s3 = V_::exp(V_::load(tail.buf) - ms);
  for (v = 0; v + 3 * W <= full; v += 3 * W) {
    s0 += V_::exp(V_::load(x + v) - ms);
    s1 += V_::exp(V_::load(x + v + W) - ms);
    s2 += V_::exp(V_::load(x + v + 2 * W) - ms);
  }
  for (; v < full; v += W) s0 += V_::exp(V_::load(x + v) - ms);
  const f32 sv = (s0 + s1) + (s2 + s3);
  float sum = 0;
  for (int i = 0; i < W; ++i) sum += sv[i];
  return m + __builtin_logf(sum);
}

template <int W, typename T>
void softmax_grad_row(const T* x, T* out, int64_t V, float g, float lse) {
  using V_ = Vec<W>;
  const typename V_::f32 lv = V_::splat(lse), ng = V_::splat(-g);
  const int64_t full = V - V % W;
  for (int64_t v = 0; v < full; v += W) V_::store(out + v, ng * V_::exp(V_::load(x + v) - lv));
  if (full < V) {
    Tail<W, T> tail(x + full, V - full);
    V_::store(tail.buf, ng * V_::exp(V_::load(tail.buf) - lv));
    for (int64_t v = full; v < V; ++v) out[v] = tail.buf[v - full];
  }
}

template <int W>
void tanh_inplace(float* x, int64_t n) {
  using V_ = Vec<W>;
  const int64_t full = n - n % W;
  for (int64_t i = 0; i < full; i += W) V_::store(x + i, V_::tanh(V_::load(x + i)));
  if (full < n) {
    float buf[W] = {};
    for (int64_t i = full; i < n; ++i) buf[i - full] = x[i];
    V_::store(buf, V_::tanh(V_::load(buf)));
    for (int64_t i = full; i < n; ++i) x[i] = buf[i - full];
  }
}

template <int W>
float lane_sum(typename Vec<W>::f32 v) {
  float s = 0.0f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

// R rows of out[m, j] = b[j] + dot(x[m, :], w[j, :]): each weight row is loaded once for the R
// input rows, whose sums stay in registers.
template <int W, int R>
void linear_block(const float* x, int64_t x_stride, int64_t K, const float* w, const float* b,
                  int64_t J, float* out) {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  const int64_t full = K - K % W;
  for (int64_t j = 0; j < J; ++j) {
    const float* wj = w + j * K;
    f32 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = V_::splat(0.0f);
    for (int64_t k = 0; k < full; k += W) {
      const f32 wv = V_::load(wj + k);
      for (int r = 0; r < R; ++r) acc[r] += V_::load(x + r * x_stride + k) * wv;
    }
    for (int r = 0; r < R; ++r) {
      float s = lane_sum<W>(acc[r]);
      for (int64_t k = full; k < K; ++k) s += x[r * x_stride + k] * wj[k];
      out[r * J + j] = s + b[j];
    }
  }
}

template <int W>
void linear_rows(const float* x, int64_t x_stride, int64_t M, int64_t K, const float* w,
                 const float* b, int64_t J, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    linear_block<W, 4>(x + m * x_stride, x_stride, K, w, b, J, out + m * J);
  for (; m < M; ++m) linear_block<W, 1>(x + m * x_stride, x_stride, K, w, b, J, out + m * J);
}

// The policy-loss terms of W tokens (the vector form of clipped_token in policy_loss.h).
template <int W>
struct PolicyLanes {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  using i32 = typename V_::i32;
  f32 loss, dloss, kl;
  i32 clipped;

  PolicyLanes(const PolicyRow& r, f32 lp, f32 old, f32 beh, f32 adv) {
    const f32 log_ratio = lp - old;
    const f32 ratio = V_::exp(log_ratio);
    const f32 lo = V_::splat(r.lo), hi = V_::splat(r.hi), zero = V_::splat(0.0f);
    const f32 clipped_ratio = ratio < lo ? lo : (ratio > hi ? hi : ratio);
    const f32 unclipped_term = ratio * adv;
    const i32 unclipped = unclipped_term <= clipped_ratio * adv;
    loss = unclipped ? -unclipped_term : -(clipped_ratio * adv);
    dloss = unclipped ? -unclipped_term : zero;
    clipped = ((ratio < lo) & (adv < zero)) | ((ratio > hi) & (adv > zero));
    if (r.dual_clip > 0) {
      const f32 cap = -adv * r.dual_clip;
      const i32 capped = (adv < zero) & (loss > cap);
      loss = capped ? cap : loss;
      dloss = capped ? zero : dloss;
      clipped |= capped;
    }
    if (r.behavior_log_prob) {
      const f32 w = V_::exp(old - beh);
      const f32 cap = V_::splat(r.is_cap);
      const f32 weight = w < cap ? w : cap;
      loss *= weight;
      dloss *= weight;
    }
    kl = (ratio - 1.0f) - log_ratio;
  }
};

template <int W>
void policy_row(const PolicyRow& r, float* sums, float* grad, float grad_scale) {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  using i32 = typename V_::i32;
  const f32 zero = V_::splat(0.0f), one = V_::splat(1.0f), scale = V_::splat(grad_scale);
  f32 loss = zero, tokens = zero, clipped = zero, kl = zero;
  auto lanes = [&](const float* lp, const float* old, const float* beh, const float* adv,
                   const uint8_t* mask, float* g) {
    const f32 a = r.advantage ? V_::load(adv) : V_::splat(r.advantage_value);
    const PolicyLanes<W> k(r, V_::load(lp), V_::load(old), beh ? V_::load(beh) : zero, a);
    const i32 on = V_::load_mask(mask);
    // Selects, never products with the mask: a masked token's terms may be NaN.
    loss += on ? k.loss : zero;
    tokens += on ? one : zero;
    clipped += (on & k.clipped) ? one : zero;
    kl += on ? k.kl : zero;
    if (g) V_::store(g, on ? scale * k.dloss : zero);
  };
  const int64_t full = r.T - r.T % W;
  for (int64_t t = 0; t < full; t += W) {
    lanes(r.log_prob + t, r.old_log_prob + t,
          r.behavior_log_prob ? r.behavior_log_prob + t : nullptr,
          r.advantage ? r.advantage + t : nullptr, r.mask + t, grad ? grad + t : nullptr);
  }
  if (full < r.T) {  // the tail through W-lane buffers, masked beyond the row's end
    const int64_t n = r.T - full;
    float lp[W] = {}, old[W] = {}, beh[W] = {}, adv[W] = {}, g[W] = {};
    uint8_t mask[W] = {};
    for (int64_t i = 0; i < n; ++i) {
      lp[i] = r.log_prob[full + i];
      old[i] = r.old_log_prob[full + i];
      if (r.behavior_log_prob) beh[i] = r.behavior_log_prob[full + i];
      if (r.advantage) adv[i] = r.advantage[full + i];
      mask[i] = r.mask[full + i];
    }
    lanes(lp, old, beh, adv, mask, grad ? g : nullptr);
    if (grad) {
      for (int64_t i = 0; i < n; ++i) grad[full + i] = g[i];
    }
  }
  float out[4] = {0, 0, 0, 0};
  for (int i = 0; i < W; ++i) {
    out[0] += loss[i];
    out[1] += tokens[i];
    out[2] += clipped[i];
    out[3] += kl[i];
  }
  for (int i = 0; i < 4; ++i) sums[i] = out[i];
}

// One term p log p of the entropy sum, with y = x - lse = log p. Where p is exactly 0 (a -inf
// logit, the tail's -inf padding, or below exp's range) the term is 0, not 0 * -inf = NaN; a
// NaN logit (NaN lse) still gives NaN.
template <int W>
typename Vec<W>::f32 p_log_p(typename Vec<W>::f32 y) {
  using V_ = Vec<W>;
  const typename V_::f32 p = V_::exp(y), zero = V_::splat(0.0f);
  return p == zero ? zero : p * y;
}

template <int W, typename T>
float entropy_row(const T* __restrict__ x, int64_t V, float lse) {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  const f32 lv = V_::splat(lse);
  const int64_t full = V - V % W;
  f32 s0 = V_::splat(0.0f), s1 = s0;
  int64_t v = 0;
  for (; v + 2 * W <= full; v += 2 * W) {  // two accumulators hide the adds' latency
    s0 += p_log_p<W>(V_::load(x + v) - lv);
    s1 += p_log_p<W>(V_::load(x + v + W) - lv);
  }
  for (; v < full; v += W) s0 += p_log_p<W>(V_::load(x + v) - lv);
  if (full < V) {
    const Tail<W, T> tail(x + full, V - full);
    s1 += p_log_p<W>(V_::load(tail.buf) - lv);
  }
  return -lane_sum<W>(s0 + s1);
}

template <int W, typename T>
void entropy_grad_row(const T* x, T* out, int64_t V, float g, float lse, float entropy) {
  using V_ = Vec<W>;
  using f32 = typename V_::f32;
  const f32 lv = V_::splat(lse), ng = V_::splat(-g), h = V_::splat(entropy);
  const f32 zero = V_::splat(0.0f);
  auto grad = [&](f32 xv) {
    const f32 y = xv - lv;
    const f32 p = V_::exp(y);
    return p == zero ? zero : ng * p * (y + h);
  };
  const int64_t full = V - V % W;
  for (int64_t v = 0; v < full; v += W) V_::store(out + v, grad(V_::load(x + v)));
  if (full < V) {
    Tail<W, T> tail(x + full, V - full);
    V_::store(tail.buf, grad(V_::load(tail.buf)));
    for (int64_t v = full; v < V; ++v) out[v] = tail.buf[v - full];
  }
}

template <int W>
Kernels make_kernels() {
  return {&logsumexp_row<W, float>,
          &logsumexp_row<W, uint16_t>,
          &softmax_grad_row<W, float>,
          &softmax_grad_row<W, uint16_t>,
          &policy_row<W>,
          &tanh_inplace<W>,
          &linear_rows<W>,
          &entropy_row<W, float>,
          &entropy_row<W, uint16_t>,
          &entropy_grad_row<W, float>,
          &entropy_grad_row<W, uint16_t>};
}

}  // namespace
}  // namespace nostall::rows
