/* The physical reference for the GAE benchmark: a plain single-threaded C loop over the same
 * time-major [T, N] float32 data, written the straightforward way (rows backward in time,
 * contiguous inner loop). Compiled by bench_advantages.py with -O3 -march=native. */
#include <stdbool.h>
#include <stdint.h>

void plain_gae(const float* reward, const float* value, const float* next_value,
               const bool* done, const bool* terminated, float* advantage, float* value_target,
               int64_t T, int64_t N, float gamma, float lmbda) {
  const float gl = gamma * lmbda;
  for (int64_t t = T - 1; t >= 0; --t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      const float next_adv = t == T - 1 ? 0.0f : advantage[i + N];
      const float delta = reward[i] + (terminated[i] ? 0.0f : gamma * next_value[i]) - value[i];
      const float a = delta + (done[i] ? 0.0f : gl * next_adv);
      advantage[i] = a;
      value_target[i] = a + value[i];
    }
  }
}

/* The memory roofline's yardstick: a one-thread streaming copy, reading src once and writing dst
 * with non-temporal stores (no read-for-ownership of dst's lines), as a well-made
 * memory-bound kernel would. n is a multiple of 8 and both pointers are 32-byte aligned. */
#if defined(__AVX__)
#include <immintrin.h>
void stream_copy(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  }
  _mm_sfence();
}
#else
#include <string.h>
void stream_copy(float* dst, const float* src, int64_t n) { memcpy(dst, src, n * sizeof(float)); }
#endif
