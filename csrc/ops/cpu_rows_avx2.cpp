// The AVX2 build of the CPU row kernels (eight-lane vectors), used when the CPU has AVX2. Only
// this file is compiled for AVX2, and everything in it has internal linkage (see
// cpu_rows_impl.h). No FMA, as in the baseline build; only the order of the sums differs.
#include "ops/cpu_rows.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#pragma GCC push_options
#pragma GCC target("avx2")
#include "ops/cpu_rows_impl.h"
#pragma GCC pop_options

namespace nostall::rows {

Kernels avx2_kernels() {
  if (!__builtin_cpu_supports("avx2")) return {};
  return make_kernels<8>();
}

}  // namespace nostall::rows

#else

namespace nostall::rows {

Kernels avx2_kernels() { return {}; }

}  // namespace nostall::rows

#endif
