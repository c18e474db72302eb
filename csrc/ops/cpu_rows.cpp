// The baseline build of the CPU row kernels (SSE2 / NEON: four-lane vectors), and the choice
// between it and the AVX2 build.
#include "ops/cpu_rows.h"

#include "ops/cpu_rows_impl.h"

namespace nostall::rows {

Kernels baseline_kernels() { return make_kernels<4>(); }

const Kernels& kernels() {
  static const Kernels chosen = [] {
    const Kernels avx2 = avx2_kernels();
    return avx2.logsumexp_f32 != nullptr ? avx2 : baseline_kernels();
  }();
  return chosen;
}

}  // namespace nostall::rows
