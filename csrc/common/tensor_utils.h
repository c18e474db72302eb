// Tensor helpers for kernels, over the stable ABI. Each stable-ABI op is a full dispatcher call
// (about 1 us), so helpers skip the call where the answer is already known.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

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

}  // namespace nostall
