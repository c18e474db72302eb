// CUDA kernels of the nostall operators (schemas are in registration.cpp). Built into
// nostall._C_cuda only when the installed torch has CUDA.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include "envs/env_ops.h"
#include "ops/discounted_returns.h"
#include "ops/episodes.h"
#include "ops/gae.h"
#include "ops/group_advantages.h"
#include "ops/mlp.h"
#include "ops/policy_loss.h"
#include "ops/ppo_loss.h"
#include "ops/sample_categorical.h"
#include "ops/sample_tokens.h"
#include "ops/token_log_prob.h"
#include "ops/vtrace.h"

STABLE_TORCH_LIBRARY_IMPL(nostall, CUDA, m) {
  m.impl("gae", TORCH_BOX(&nostall::gae_cuda));
  m.impl("gae_backward", TORCH_BOX(&nostall::gae_backward_cuda));
  m.impl("discounted_returns", TORCH_BOX(&nostall::discounted_returns_cuda));
  m.impl("discounted_returns_backward", TORCH_BOX(&nostall::discounted_returns_backward_cuda));
  m.impl("vtrace", TORCH_BOX(&nostall::vtrace_cuda));
  m.impl("group_advantages", TORCH_BOX(&nostall::group_advantages_cuda));
  m.impl("group_advantages_backward", TORCH_BOX(&nostall::group_advantages_backward_cuda));
  m.impl("token_log_prob", TORCH_BOX(&nostall::token_log_prob_cuda));
  m.impl("token_log_prob_backward", TORCH_BOX(&nostall::token_log_prob_backward_cuda));
  m.impl("token_log_prob_linear", TORCH_BOX(&nostall::token_log_prob_linear_cuda));
  m.impl("token_log_prob_linear_backward",
         TORCH_BOX(&nostall::token_log_prob_linear_backward_cuda));
  m.impl("token_entropy_linear", TORCH_BOX(&nostall::token_entropy_linear_cuda));
  m.impl("token_entropy_linear_backward", TORCH_BOX(&nostall::token_entropy_linear_backward_cuda));
  m.impl("clipped_policy_loss", TORCH_BOX(&nostall::clipped_policy_loss_cuda));
  m.impl("clipped_policy_loss_backward", TORCH_BOX(&nostall::clipped_policy_loss_backward_cuda));
  m.impl("mlp", TORCH_BOX(&nostall::mlp_cuda));
  m.impl("ppo_loss", TORCH_BOX(&nostall::ppo_loss_cuda));
  m.impl("ppo_loss_backward", TORCH_BOX(&nostall::ppo_loss_backward_cuda));
  m.impl("ppo_loss_from_log_prob", TORCH_BOX(&nostall::ppo_loss_from_log_prob_cuda));
  m.impl("ppo_loss_from_log_prob_backward",
         TORCH_BOX(&nostall::ppo_loss_from_log_prob_backward_cuda));
  m.impl("episode_update", TORCH_BOX(&nostall::episode_update_cuda));
  m.impl("sample_categorical", TORCH_BOX(&nostall::sample_categorical_cuda));
  m.impl("sample_tokens", TORCH_BOX(&nostall::sample_tokens_cuda));
  m.impl("mlp_backward", TORCH_BOX(&nostall::mlp_backward_cuda));
  m.impl("env_step", TORCH_BOX(&nostall::envs::env_step_cuda));
  m.impl("env_step_into", TORCH_BOX(&nostall::envs::env_step_into_cuda));
  m.impl("env_rollout", TORCH_BOX(&nostall::envs::env_rollout_cuda));
}

extern "C" {
PyObject* PyInit__C_cuda(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C_cuda", "nostall CUDA kernels (see torch.ops.nostall)", -1, nullptr,
  };
  return PyModule_Create(&module_def);
}
}
