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
