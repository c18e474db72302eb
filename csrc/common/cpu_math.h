// Scalar conversions on the CPU between a logits type and its accumulation type (acc_t).
#pragma once

#include <torch/headeronly/util/BFloat16.h>

#include <cstdint>
#include <cstring>

#include "common/dispatch.h"

namespace nostall {

inline float to_acc(float x) { return x; }
inline double to_acc(double x) { return x; }
// bfloat16 is the high half of a float32: widening is a shift.
inline float to_acc(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <typename S>
inline S from_acc(acc_t<S> x) {
  return x;
}
// Round to nearest even, as torch does; NaN stays NaN.
template <>
inline c10::BFloat16 from_acc<c10::BFloat16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(x != x ? 0x7FC0u : rounded);
  return out;
}

}  // namespace nostall
