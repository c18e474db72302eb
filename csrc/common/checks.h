// Argument checks shared by every op. Each failure names the argument, so a user who passed the
// wrong tensor learns which one. All checks read metadata only: none touches tensor data, so
// none synchronises a CUDA device.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>

namespace nostall {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline bool is_floating(const Tensor& t) {
  return t.scalar_type() == ScalarType::Float || t.scalar_type() == ScalarType::Double;
}

// A time-major [T, N] float32/float64 tensor with T >= 1 and N >= 1.
inline void check_time_major(const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.dim() == 2, name, " must be a time-major [T, N] tensor, got ", t.dim(),
                  " dimensions");
  STD_TORCH_CHECK(is_floating(t), name, " must be float32 or float64, got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.size(0) >= 1 && t.size(1) >= 1, name, " must have T >= 1 and N >= 1, got [",
                  t.size(0), ", ", t.size(1), "]");
}

inline void check_same_shape_and_device(const Tensor& t, const char* name, const Tensor& ref,
                                        const char* ref_name) {
  STD_TORCH_CHECK(t.dim() == ref.dim() && t.size(0) == ref.size(0) && t.size(1) == ref.size(1),
                  name, " must have the shape of ", ref_name, " [", ref.size(0), ", ", ref.size(1),
                  "]");
  STD_TORCH_CHECK(t.device() == ref.device(), name, " must be on the device of ", ref_name);
}

// A float tensor that must match `ref` (the op's first float argument) in shape, dtype, device.
inline void check_like(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name) {
  STD_TORCH_CHECK(t.dim() == 2, name, " must be a time-major [T, N] tensor, got ", t.dim(),
                  " dimensions");
  check_same_shape_and_device(t, name, ref, ref_name);
  STD_TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have the dtype of ", ref_name,
                  " (", torch::headeronly::toString(ref.scalar_type()), "), got ",
                  torch::headeronly::toString(t.scalar_type()));
}

// An episode-boundary flag tensor: bool, with the shape and device of `ref`.
inline void check_flags(const Tensor& t, const char* name, const Tensor& ref,
                        const char* ref_name) {
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Bool, name, " must be bool, got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.dim() == 2, name, " must be a time-major [T, N] tensor, got ", t.dim(),
                  " dimensions");
  check_same_shape_and_device(t, name, ref, ref_name);
}

inline void check_unit_interval(double x, const char* name) {
  STD_TORCH_CHECK(x >= 0.0 && x <= 1.0, name, " must lie in [0, 1], got ", x);
}

// a * b for a size, refused when int64 cannot hold it: a wrapped product would allocate or index
// the wrong amount of memory (or pass a shape check by chance) instead of failing. `product` names
// it in the arguments' words, e.g. "Bp * group_size".
inline int64_t checked_product(int64_t a, int64_t b, const char* op, const char* product) {
  int64_t out = 0;
  STD_TORCH_CHECK(!__builtin_mul_overflow(a, b, &out), op, ": ", product, " = ", a, " * ", b,
                  " overflows int64");
  return out;
}

inline void check_positive(double x, const char* name) {
  STD_TORCH_CHECK(x > 0.0 && std::isfinite(x), name, " must be a positive finite number, got ", x);
}

}  // namespace nostall
