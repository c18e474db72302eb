// Every nostall operator schema, declared once, with the CPU kernels. CUDA kernels register in
// registration_cuda.cu (a separate library, built only against a CUDA torch). Fake (meta)
// implementations, autograd formulas and vmap rules live in nostall/ops/.
#include <torch/csrc/stable/library.h>

#include "ops/discounted_returns.h"
#include "ops/gae.h"
#include "ops/vtrace.h"

STABLE_TORCH_LIBRARY(nostall, m) {
  // GAE over time-major [T, N] rollouts; done stops the recursion, terminated drops the bootstrap.
  m.def(
      "gae(Tensor reward, Tensor value, Tensor next_value, Tensor done, Tensor terminated, "
      "float gamma, float lmbda) -> (Tensor advantage, Tensor value_target)");
  // Adjoint of gae: gradients of (advantage, value_target) to (reward, value, next_value).
  m.def(
      "gae_backward(Tensor grad_advantage, Tensor grad_value_target, Tensor done, "
      "Tensor terminated, float gamma, float lmbda) "
      "-> (Tensor grad_reward, Tensor grad_value, Tensor grad_next_value)");
  // Discounted [T, N] returns, bootstrapping from bootstrap_value where the chain is cut.
  m.def(
      "discounted_returns(Tensor reward, Tensor done, Tensor terminated, Tensor bootstrap_value, "
      "float gamma) -> Tensor");
  // Adjoint of discounted_returns: gradient of returns to (reward, bootstrap_value).
  m.def(
      "discounted_returns_backward(Tensor grad_returns, Tensor done, Tensor terminated, "
      "float gamma) -> (Tensor grad_reward, Tensor grad_bootstrap_value)");
  // IMPALA V-trace targets over [T, N]; importance weights clipped at rho_bar and c_bar.
  m.def(
      "vtrace(Tensor behavior_log_prob, Tensor target_log_prob, Tensor reward, Tensor value, "
      "Tensor next_value, Tensor done, Tensor terminated, float gamma, float rho_bar, "
      "float c_bar) -> (Tensor value_target, Tensor pg_advantage)");
}

STABLE_TORCH_LIBRARY_IMPL(nostall, CPU, m) {
  m.impl("gae", TORCH_BOX(&nostall::gae_cpu));
  m.impl("gae_backward", TORCH_BOX(&nostall::gae_backward_cpu));
  m.impl("discounted_returns", TORCH_BOX(&nostall::discounted_returns_cpu));
  m.impl("discounted_returns_backward", TORCH_BOX(&nostall::discounted_returns_backward_cpu));
  m.impl("vtrace", TORCH_BOX(&nostall::vtrace_cpu));
}
