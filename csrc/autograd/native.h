// Shared pieces of the autograd kernels (nostall._C_autograd).
//
// These files use the regular (version-bound) LibTorch ABI, in a library of their own, because
// the stable ABI has no autograd: a Python register_autograd kernel would do the same job but
// costs about 13 us on every eager call, more than the GAE kernel itself at rollout sizes. Each
// backward calls a native backward op through the dispatcher.
#pragma once

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

namespace nostall::autograd {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Pair = std::tuple<Tensor, Tensor>;
using Triple = std::tuple<Tensor, Tensor, Tensor>;

// The typed dispatcher handle of a nostall op (looked up once per call site).
template <typename Signature>
c10::TypedOperatorHandle<Signature> native(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace nostall::autograd
