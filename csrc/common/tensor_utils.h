// Tensor helpers for kernels, over the stable ABI. Each stable-ABI op is a full dispatcher call
// (about 1 us), so helpers skip the call where the answer is already known.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <initializer_list>

namespace nostall {

// The tensor itself when already contiguous (the common case), else a contiguous copy.
inline torch::stable::Tensor as_contiguous(const torch::stable::Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

template <typename S>
const S* in_ptr(const torch::stable::Tensor& t) {
  return t.const_data_ptr<S>();
}

template <typename S>
S* out_ptr(torch::stable::Tensor& t) {
  return t.mutable_data_ptr<S>();
}

// The transpose of a 2-D tensor as a view, without a dispatcher call (a strided alias).
inline torch::stable::Tensor transposed(const torch::stable::Tensor& t) {
  const int64_t sizes[2] = {t.size(1), t.size(0)};
  const int64_t strides[2] = {t.stride(1), t.stride(0)};
  AtenTensorHandle out = nullptr;
  // The shim's offset argument is added to t's own storage offset.
  STD_TORCH_CHECK(
      aoti_torch__reinterpret_tensor(t.get(), 2, sizes, strides, 0, &out) == AOTI_TORCH_SUCCESS,
      "could not make a transposed view");
  return torch::stable::Tensor(out);
}

// Entry i of a tensor's first dimension (a [T, ...] tensor's step i) as a view, without a
// dispatcher call.
inline torch::stable::Tensor select_first(const torch::stable::Tensor& t, int64_t i) {
  const int64_t ndim = t.dim();
  STD_TORCH_CHECK(ndim >= 1 && ndim <= 4, "select_first: 1 to 4 dimensions");
  int64_t sizes[3] = {0, 0, 0}, strides[3] = {0, 0, 0};
  for (int64_t d = 1; d < ndim; ++d) {
    sizes[d - 1] = t.size(d);
    strides[d - 1] = t.stride(d);
  }
  AtenTensorHandle out = nullptr;
  // The shim's offset argument is added to t's own storage offset.
  STD_TORCH_CHECK(aoti_torch__reinterpret_tensor(t.get(), ndim - 1, sizes, strides, i * t.stride(0),
                                                 &out) == AOTI_TORCH_SUCCESS,
                  "could not make a row view");
  return torch::stable::Tensor(out);
}

// A fresh contiguous tensor of `sizes` (at most 2 dimensions) of dtype `dtype` (a shim dtype
// code) on the device of `like`, allocated through the C shim (no dispatcher call: this is on the
// per-step path of small ops).
inline torch::stable::Tensor new_contiguous(const torch::stable::Tensor& like,
                                            std::initializer_list<int64_t> sizes, int32_t dtype) {
  STD_TORCH_CHECK(sizes.size() >= 1 && sizes.size() <= 2, "new_contiguous: 1 or 2 dimensions");
  int32_t device_type = 0, device_index = 0;
  STD_TORCH_CHECK(aoti_torch_get_device_type(like.get(), &device_type) == AOTI_TORCH_SUCCESS &&
                      aoti_torch_get_device_index(like.get(), &device_index) == AOTI_TORCH_SUCCESS,
                  "could not read a tensor's device");
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  const int64_t* size = sizes.begin();
  const int64_t strides[2] = {ndim == 2 ? size[1] : 1, 1};
  AtenTensorHandle out = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(ndim, size, strides, dtype, device_type, device_index,
                                           &out) == AOTI_TORCH_SUCCESS,
                  "could not allocate a tensor");
  return torch::stable::Tensor(out);
}

// The same with the dtype of `like`.
inline torch::stable::Tensor new_contiguous(const torch::stable::Tensor& like,
                                            std::initializer_list<int64_t> sizes) {
  int32_t dtype = 0;
  STD_TORCH_CHECK(aoti_torch_get_dtype(like.get(), &dtype) == AOTI_TORCH_SUCCESS,
                  "could not read a tensor's dtype");
  return new_contiguous(like, sizes, dtype);
}

// The same in float32 (the native decoder's activations, whatever its weights' dtype).
inline torch::stable::Tensor new_float(const torch::stable::Tensor& like,
                                       std::initializer_list<int64_t> sizes) {
  return new_contiguous(like, sizes, aoti_torch_dtype_float32());
}

}  // namespace nostall
