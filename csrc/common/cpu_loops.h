// Parallel loops for CPU kernels over time-major [T, N] data: the N columns are independent, so
// bands of columns run in parallel and each walks its rows in time order.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cstdint>

namespace nostall {

// Columns per band: wide enough to vectorise, and enough work per band (about 64k elements)
// that handing a band to another thread costs little next to the band itself.
inline int64_t column_grain(int64_t T) {
  const int64_t by_work = (int64_t{1} << 16) / (T > 0 ? T : 1);
  return by_work > 32 ? by_work : 32;
}

// Runs f(n0, n1) over bands covering [0, N); inline, with no thread-pool call, when one band
// covers everything.
template <typename F>
void for_column_bands(int64_t N, int64_t T, const F& f) {
  const int64_t grain = column_grain(T);
  if (N <= grain) {
    f(0, N);
  } else {
    torch::stable::parallel_for(0, N, grain, f);
  }
}

}  // namespace nostall
