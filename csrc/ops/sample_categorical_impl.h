// One row of sample_categorical (see sample_categorical.h), shared by the CPU kernel and the
// CUDA kernel (one thread per row: action spaces are small).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dispatch.h"

namespace nostall {

template <typename S>
NOSTALL_HD inline void sample_row(const S* logits, int64_t ls, const S* uniform, int64_t us,
                                  int64_t A, int64_t* action, S* log_prob, S* logsumexp) {
  using std::exp;
  using std::log;
  int64_t best = 0;
  S best_score = S(0), m = S(0);
  for (int64_t a = 0; a < A; ++a) {
    const S x = logits[a * ls];
    S u = uniform[a * us];
    u = u < S(1e-20) ? S(1e-20) : u;
    const S score = x - log(-log(u));
    if (a == 0 || score > best_score) {  // strict: ties keep the lowest index
      best = a;
      best_score = score;
    }
    m = (a == 0 || x > m) ? x : m;
  }
  S sum = S(0);
  for (int64_t a = 0; a < A; ++a) sum += exp(logits[a * ls] - m);
  const S lse = m + log(sum);
  *action = best;
  *log_prob = logits[best * ls] - lse;
  *logsumexp = lse;
}

}  // namespace nostall
