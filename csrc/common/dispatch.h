// Dtype dispatch and host/device qualifiers shared by CPU and CUDA kernels.
#pragma once

#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define NOSTALL_HD __host__ __device__
#else
#define NOSTALL_HD
#endif

namespace nostall {

// Calls f(S{}) with S = float or double, the two dtypes the advantage ops accept
// (checked before dispatch).
template <typename F>
void dispatch_floating(torch::headeronly::ScalarType dtype, F&& f) {
  if (dtype == torch::headeronly::ScalarType::Double) {
    f(double{});
  } else {
    f(float{});
  }
}

// Calls f(S{}) with S = float, double or c10::BFloat16: the dtypes of logits (checked before).
template <typename F>
void dispatch_logits(torch::headeronly::ScalarType dtype, F&& f) {
  if (dtype == torch::headeronly::ScalarType::BFloat16) {
    f(c10::BFloat16{});
  } else {
    dispatch_floating(dtype, f);
  }
}

// The accumulation type of a logits type: float64 stays float64, float32 and bfloat16
// accumulate in float32 (as accumulation_dtype in ops/token_log_prob.h says for tensors).
template <typename S>
struct Accumulate {
  using type = float;
};
template <>
struct Accumulate<double> {
  using type = double;
};
template <typename S>
using acc_t = typename Accumulate<S>::type;

// Branch-free selects with exact semantics (`cond ? 0 : x` never evaluates to NaN from x, unlike
// `x * !cond`). On the CPU they are written as bit masks, which the compiler vectorises where a
// ternary on a loaded bool stays a branch; on the GPU a ternary is already a select.
template <typename S>
NOSTALL_HD inline S pick(bool cond, S if_true, S if_false) {
#ifdef __CUDA_ARCH__
  return cond ? if_true : if_false;
#else
  using Bits = std::conditional_t<sizeof(S) == 4, uint32_t, uint64_t>;
  const Bits mask = static_cast<Bits>(-static_cast<std::make_signed_t<Bits> >(cond));
  Bits a, b;
  std::memcpy(&a, &if_true, sizeof(S));
  std::memcpy(&b, &if_false, sizeof(S));
  const Bits out = (a & mask) | (b & ~mask);
  S result;
  std::memcpy(&result, &out, sizeof(S));
  return result;
#endif
}

template <typename S>
NOSTALL_HD inline S zero_if(bool cond, S x) {
  return pick(cond, S(0), x);
}

}  // namespace nostall
