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
#include <ATen/core/grad_mode.h>
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

// Whether autograd would record a graph through any of these tensors (undefined ones skipped).
inline bool any_requires_grad(std::initializer_list<const Tensor*> tensors) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : tensors) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

inline bool any_requires_grad(at::TensorList tensors) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// The backward ops have no derivative of their own: asked for one (double backward), they say
// so instead of silently giving zero, as an op with no autograd kernel would.
inline void reject_double_backward(const char* op, bool requires_grad) {
  TORCH_CHECK(!requires_grad, "nostall::", op, " has no second derivative: nostall::", op,
              "_backward is not differentiable (an input of it requires grad)");
}

inline void reject_double_backward(const char* op, std::initializer_list<const Tensor*> tensors) {
  reject_double_backward(op, any_requires_grad(tensors));
}

}  // namespace nostall::autograd
