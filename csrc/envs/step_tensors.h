// Step-output tensors and action checks shared by the CPU and CUDA step kernels. Inline: the
// CUDA library compiles its own copy (stable-ABI tensor types are not exported across
// libraries), while the engine and handle registry it calls stay one, in the core library.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <string>
#include <tuple>

#include "envs/core/vec_env.h"

namespace nostall::envs {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using StepTensors = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

// Shape and dtype of an action batch of `rows` environments.
inline void check_action_tensor(const VecEnv& env, const Tensor& actions, int64_t rows) {
  const EnvSpec& s = env.spec();
  if (s.discrete) {
    STD_TORCH_CHECK(actions.scalar_type() == ScalarType::Long, s.id,
                    ": actions must be int64 (discrete), got ",
                    torch::headeronly::toString(actions.scalar_type()));
    STD_TORCH_CHECK(actions.dim() == 1 && actions.size(0) == rows, s.id,
                    ": actions must have shape [", rows, "]");
  } else {
    STD_TORCH_CHECK(actions.scalar_type() == ScalarType::Float, s.id,
                    ": actions must be float32 (continuous), got ",
                    torch::headeronly::toString(actions.scalar_type()));
    STD_TORCH_CHECK(
        actions.dim() == 2 && actions.size(0) == rows && actions.size(1) == s.action_dim, s.id,
        ": actions must have shape [", rows, ", ", s.action_dim, "]");
  }
}

// Outputs of one step on the device of `like` (final_obs is [0, obs_dim] unless autoreset is
// same-step).
inline StepTensors new_step_outputs(const VecEnv& env, const Tensor& like, int64_t rows) {
  const int64_t obs_dim = env.spec().obs_dim;
  const bool same_step = env.config().autoreset_mode == AutoresetMode::kSameStep;
  using torch::stable::new_empty;
  return {new_empty(like, {rows, obs_dim}, ScalarType::Float),
          new_empty(like, {rows}, ScalarType::Double), new_empty(like, {rows}, ScalarType::Bool),
          new_empty(like, {rows}, ScalarType::Bool),
          new_empty(like, {same_step ? rows : 0, obs_dim}, ScalarType::Float)};
}

// Caller-provided outputs (env_step_into): contiguous, of the step's shapes and dtypes, on the
// device of the actions.
inline void check_step_outputs(const VecEnv& env, const Tensor& actions, const StepTensors& out) {
  const EnvSpec& s = env.spec();
  const int64_t n = env.num_envs();
  const bool same_step = env.config().autoreset_mode == AutoresetMode::kSameStep;
  const auto check = [&](const Tensor& t, const char* name, ScalarType dtype, int64_t rows,
                         int64_t cols) {
    const bool shape_ok = cols < 0 ? (t.dim() == 1 && t.size(0) == rows)
                                   : (t.dim() == 2 && t.size(0) == rows && t.size(1) == cols);
    STD_TORCH_CHECK(shape_ok && t.scalar_type() == dtype, s.id, ": ", name, " must be ",
                    torch::headeronly::toString(dtype), " of shape [", rows, cols < 0 ? "" : ", ",
                    cols < 0 ? "" : std::to_string(cols), "]");
    STD_TORCH_CHECK(t.is_contiguous(), s.id, ": ", name, " must be contiguous");
    STD_TORCH_CHECK(t.device() == actions.device(), s.id, ": ", name,
                    " must be on the device of actions");
  };
  const auto& [obs, reward, terminated, truncated, final_obs] = out;
  check(obs, "obs", ScalarType::Float, n, s.obs_dim);
  check(reward, "reward", ScalarType::Double, n, -1);
  check(terminated, "terminated", ScalarType::Bool, n, -1);
  check(truncated, "truncated", ScalarType::Bool, n, -1);
  check(final_obs, "final_obs", ScalarType::Float, same_step ? n : 0, s.obs_dim);
  // The step writes each output in turn: two that alias would silently hold one another's
  // values (terminated overwritten by truncated, say).
  const Tensor* all[] = {&obs, &reward, &terminated, &truncated, &final_obs};
  const char* names[] = {"obs", "reward", "terminated", "truncated", "final_obs"};
  for (int a = 0; a < 5; ++a) {
    for (int b = a + 1; b < 5; ++b) {
      const auto* pa = static_cast<const char*>(all[a]->data_ptr());
      const auto* pb = static_cast<const char*>(all[b]->data_ptr());
      const int64_t na = all[a]->numel() * static_cast<int64_t>(all[a]->element_size());
      const int64_t nb = all[b]->numel() * static_cast<int64_t>(all[b]->element_size());
      const bool overlap = na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
      STD_TORCH_CHECK(!overlap, s.id, ": ", names[a], " and ", names[b], " must not share memory");
    }
  }
}

inline StepOutput output_pointers(StepTensors& out) {
  auto& [obs, reward, terminated, truncated, final_obs] = out;
  return {obs.mutable_data_ptr<float>(),
          reward.mutable_data_ptr<double>(),
          terminated.mutable_data_ptr<bool>(),
          truncated.mutable_data_ptr<bool>(),
          final_obs.size(0) > 0 ? final_obs.mutable_data_ptr<float>() : nullptr,
          nullptr};
}

}  // namespace nostall::envs
