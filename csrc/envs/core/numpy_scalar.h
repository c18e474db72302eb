// A NumPy scalar or Python float, with NumPy 2's promotion rules (NEP 50), for the few
// Gymnasium environments whose step mixes float32 and float64 values. Python numbers are
// "weak": float32 op Python float stays float32, computed in float32; float32 op float64 is
// float64. Mirroring the types keeps those environments bit-identical to Gymnasium.
#pragma once

#include <cmath>

namespace nostall::envs {

struct NpScalar {
  enum Kind { kFloat32, kFloat64, kPython };
  Kind kind;
  double value;

  static NpScalar f32(float v) { return {kFloat32, v}; }
  static NpScalar f64(double v) { return {kFloat64, v}; }
  static NpScalar py(double v) { return {kPython, v}; }

  static Kind promote(Kind a, Kind b) {
    if (a == b) return a;
    if (a == kPython) return b;
    if (b == kPython) return a;
    return kFloat64;
  }

  template <typename Op>
  static NpScalar apply(NpScalar a, NpScalar b, Op op) {
    const Kind k = promote(a.kind, b.kind);
    if (k == kFloat32) {
      return {k, static_cast<double>(op(static_cast<float>(a.value), static_cast<float>(b.value)))};
    }
    return {k, op(a.value, b.value)};
  }

  template <typename Cmp>
  static bool compare(NpScalar a, NpScalar b, Cmp cmp) {
    if (promote(a.kind, b.kind) == kFloat32) {
      return cmp(static_cast<float>(a.value), static_cast<float>(b.value));
    }
    return cmp(a.value, b.value);
  }
};

inline NpScalar operator+(NpScalar a, NpScalar b) {
  return NpScalar::apply(a, b, [](auto x, auto y) { return x + y; });
}
inline NpScalar operator-(NpScalar a, NpScalar b) {
  return NpScalar::apply(a, b, [](auto x, auto y) { return x - y; });
}
inline NpScalar operator*(NpScalar a, NpScalar b) {
  return NpScalar::apply(a, b, [](auto x, auto y) { return x * y; });
}
inline bool operator<(NpScalar a, NpScalar b) {
  return NpScalar::compare(a, b, [](auto x, auto y) { return x < y; });
}
inline bool operator>(NpScalar a, NpScalar b) { return b < a; }
inline bool operator>=(NpScalar a, NpScalar b) { return !(a < b); }
inline bool operator==(NpScalar a, NpScalar b) {
  return NpScalar::compare(a, b, [](auto x, auto y) { return x == y; });
}

}  // namespace nostall::envs
