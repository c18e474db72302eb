// Non-temporal ("streaming") row writes for memory-bound CPU kernels whose outputs are too large
// for the caches: a plain store first reads the line it overwrites (read-for-ownership), a
// streaming store does not. SSE2 is part of x86-64, so no runtime dispatch is needed; elsewhere
// these are plain loops. Call stream_fence() once a thread's streaming writes are done, before
// another thread reads them.
#pragma once

#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace nostall {

// dst[i] = a[i] + (b ? b[i] : 0) for i < count, plain stores (the unaligned head and tail).
template <typename S>
inline void plain_row(S* __restrict__ dst, const S* __restrict__ a, const S* __restrict__ b,
                      int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = b ? a[i] + b[i] : a[i];
}

#if defined(__SSE2__)
// Elements to store plainly before dst is 16-byte aligned (all of them when it never will be).
template <typename S>
inline int64_t head_until_aligned(const S* dst, int64_t count) {
  const auto address = reinterpret_cast<uintptr_t>(dst);
  if (address % sizeof(S) != 0) return count;
  const int64_t head = static_cast<int64_t>((16 - address % 16) % 16 / sizeof(S));
  return head < count ? head : count;
}

inline void stream_row(float* __restrict__ dst, const float* __restrict__ a,
                       const float* __restrict__ b, int64_t count) {
  const int64_t head = head_until_aligned(dst, count);
  plain_row(dst, a, b, head);
  int64_t i = head;
  for (; i + 4 <= count; i += 4) {
    __m128 x = _mm_loadu_ps(a + i);
    if (b) x = _mm_add_ps(x, _mm_loadu_ps(b + i));
    _mm_stream_ps(dst + i, x);
  }
  plain_row(dst + i, a + i, b ? b + i : nullptr, count - i);
}

inline void stream_row(double* __restrict__ dst, const double* __restrict__ a,
                       const double* __restrict__ b, int64_t count) {
  const int64_t head = head_until_aligned(dst, count);
  plain_row(dst, a, b, head);
  int64_t i = head;
  for (; i + 2 <= count; i += 2) {
    __m128d x = _mm_loadu_pd(a + i);
    if (b) x = _mm_add_pd(x, _mm_loadu_pd(b + i));
    _mm_stream_pd(dst + i, x);
  }
  plain_row(dst + i, a + i, b ? b + i : nullptr, count - i);
}

inline void stream_fence() { _mm_sfence(); }
#else
template <typename S>
inline void stream_row(S* __restrict__ dst, const S* __restrict__ a, const S* __restrict__ b,
                       int64_t count) {
  plain_row(dst, a, b, count);
}

inline void stream_fence() {}
#endif

// dst[i] = a[i], streamed.
template <typename S>
inline void stream_copy(S* __restrict__ dst, const S* __restrict__ a, int64_t count) {
  stream_row(dst, a, static_cast<const S*>(nullptr), count);
}

// dst[i] = a[i] + b[i], streamed (the add rounds as a plain `a + b` does).
template <typename S>
inline void stream_sum(S* __restrict__ dst, const S* __restrict__ a, const S* __restrict__ b,
                       int64_t count) {
  stream_row(dst, a, b, count);
}

}  // namespace nostall
