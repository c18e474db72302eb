// CPU kernel of env_rollout: a whole rollout chunk (T steps of policy -> sample -> env step) in
// one call. Stepped from Python, each of those steps is a handful of dispatcher calls and some
// Python glue, about 170 us on CartPole with 8 envs where the arithmetic is a few microseconds;
// here the loop runs in C++ with the GIL released, and every step's policy evaluation is the
// mlp op's kernel, its sample the sample_categorical kernel, its step the engine's.
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/tensor_utils.h"
#include "envs/core/registry.h"
#include "envs/env_ops.h"
#include "ops/mlp.h"
#include "ops/sample_categorical_impl.h"

namespace nostall::envs {

namespace {

constexpr float kLogSqrt2Pi = 0.91893853320467274178f;  // log(sqrt(2 pi))

// A caller-owned chunk tensor: contiguous CPU, of `dtype`, with the given sizes.
void check_chunk_tensor(const EnvSpec& s, const Tensor& t, const char* name, ScalarType dtype,
                        std::initializer_list<int64_t> sizes) {
  bool shape_ok = t.dim() == static_cast<int64_t>(sizes.size());
  int64_t d = 0;
  std::string shape = "[";
  for (int64_t size : sizes) {
    shape += (d ? ", " : "") + std::to_string(size);
    shape_ok = shape_ok && t.size(d) == size;
    ++d;
  }
  shape += "]";
  STD_TORCH_CHECK(shape_ok && t.scalar_type() == dtype, s.id, ": ", name, " must be ",
                  torch::headeronly::toString(dtype), " of shape ", shape);
  STD_TORCH_CHECK(t.is_cpu(), s.id, ": ", name, " must be a CPU tensor (env_rollout steps the ",
                  "environments and the policy on the CPU)");
  STD_TORCH_CHECK(t.is_contiguous(), s.id, ": ", name, " must be contiguous");
}

// The network's output width, after the mlp checks (float32, on the CPU).
int64_t check_network(const EnvSpec& s, const Tensor& input_row, const std::vector<Tensor>& weights,
                      const std::vector<Tensor>& biases, const std::string& activation,
                      const char* name) {
  check_mlp_args(input_row, weights, biases, activation);
  for (const Tensor& w : weights) {
    STD_TORCH_CHECK(w.is_cpu(), s.id, ": the ", name, " weights must be CPU tensors");
  }
  return weights.back().size(0);
}

}  // namespace

void env_rollout_cpu(int64_t handle, Tensor obs, Tensor actions, Tensor log_probs, Tensor values,
                     Tensor rewards, Tensor terminated, Tensor truncated, Tensor final_obs,
                     Tensor noise, std::vector<Tensor> actor_weights,
                     std::vector<Tensor> actor_biases, std::vector<Tensor> critic_weights,
                     std::vector<Tensor> critic_biases, std::optional<Tensor> log_std,
                     std::string activation) {
  const auto env = env_for(handle);
  const EnvSpec& s = env->spec();
  const int64_t N = env->num_envs(), D = s.obs_dim;
  STD_TORCH_CHECK(log_probs.dim() == 2 && log_probs.size(0) >= 1, s.id,
                  ": log_probs must be a time-major [T, ", N, "] tensor with T >= 1");
  const int64_t T = log_probs.size(0);
  const int64_t A = s.discrete ? s.num_actions : s.action_dim;
  const bool same_step = env->config().autoreset_mode == AutoresetMode::kSameStep;
  check_chunk_tensor(s, obs, "obs", ScalarType::Float, {T + 1, N, D});
  if (s.discrete) {
    check_chunk_tensor(s, actions, "actions", ScalarType::Long, {T, N});
  } else {
    check_chunk_tensor(s, actions, "actions", ScalarType::Float, {T, N, A});
  }
  check_chunk_tensor(s, log_probs, "log_probs", ScalarType::Float, {T, N});
  check_chunk_tensor(s, values, "values", ScalarType::Float, {T, N});
  check_chunk_tensor(s, rewards, "rewards", ScalarType::Double, {T, N});
  check_chunk_tensor(s, terminated, "terminated", ScalarType::Bool, {T, N});
  check_chunk_tensor(s, truncated, "truncated", ScalarType::Bool, {T, N});
  check_chunk_tensor(s, final_obs, "final_obs", ScalarType::Float, {T, same_step ? N : 0, D});
  check_chunk_tensor(s, noise, "noise", ScalarType::Float, {T, N, A});

  const Tensor first_row = select_first(obs, 0);
  const int64_t actor_width =
      check_network(s, first_row, actor_weights, actor_biases, activation, "actor");
  STD_TORCH_CHECK(actor_width == A, s.id, ": the actor's output width must be ", A, " (",
                  s.discrete ? "one logit per action" : "the action's mean", "), got ",
                  actor_width);
  const int64_t critic_width =
      check_network(s, first_row, critic_weights, critic_biases, activation, "critic");
  STD_TORCH_CHECK(critic_width == 1, s.id, ": the critic's output width must be 1, got ",
                  critic_width);
  const float* log_std_ptr = nullptr;
  if (s.discrete) {
    STD_TORCH_CHECK(!log_std.has_value(), s.id,
                    ": log_std must be None for a discrete action space");
  } else {
    STD_TORCH_CHECK(log_std.has_value(), s.id,
                    ": log_std (the Gaussian policy's [action_dim]) is required for continuous "
                    "actions");
    check_chunk_tensor(s, *log_std, "log_std", ScalarType::Float, {A});
    log_std_ptr = log_std->const_data_ptr<float>();
  }

  const Activation act_fn = parse_activation(activation);  // checked with the networks above
  float* lp = log_probs.mutable_data_ptr<float>();
  float* value = values.mutable_data_ptr<float>();
  const float* u = noise.const_data_ptr<float>();
  std::vector<float> std_dev(static_cast<size_t>(A));
  for (int64_t a = 0; a < A && !s.discrete; ++a) std_dev[a] = std::exp(log_std_ptr[a]);
  for (int64_t t = 0; t < T; ++t) {
    const Tensor x = select_first(obs, t);
    const Tensor out = std::get<0>(mlp_cpu_checked(x, actor_weights, actor_biases, act_fn));
    const Tensor v = std::get<0>(mlp_cpu_checked(x, critic_weights, critic_biases, act_fn));
    const float* o = out.const_data_ptr<float>();
    const float* vp = v.const_data_ptr<float>();
    const float* u_t = u + t * N * A;
    for (int64_t n = 0; n < N; ++n) value[t * N + n] = vp[n];
    if (s.discrete) {
      int64_t* act = actions.mutable_data_ptr<int64_t>() + t * N;
      for (int64_t n = 0; n < N; ++n) {
        float lse = 0.0f;
        sample_row(o + n * A, 1, u_t + n * A, 1, A, act + n, lp + t * N + n, &lse);
      }
    } else {
      // As the per-step Python path computes it: a = mean + std * noise, z = (a - mean) / std.
      float* act = actions.mutable_data_ptr<float>() + t * N * A;
      for (int64_t n = 0; n < N; ++n) {
        float sum = 0.0f;
        for (int64_t a = 0; a < A; ++a) {
          const float mean = o[n * A + a];
          const float sample = mean + std_dev[a] * u_t[n * A + a];
          const float z = (sample - mean) / std_dev[a];
          act[n * A + a] = sample;
          sum += -0.5f * (z * z) - log_std_ptr[a] - kLogSqrt2Pi;
        }
        lp[t * N + n] = sum;
      }
    }
    const void* step_actions =
        s.discrete ? static_cast<const void*>(actions.const_data_ptr<int64_t>() + t * N)
                   : static_cast<const void*>(actions.const_data_ptr<float>() + t * N * A);
    env->step(
        step_actions,
        StepOutput{obs.mutable_data_ptr<float>() + (t + 1) * N * D,
                   rewards.mutable_data_ptr<double>() + t * N,
                   terminated.mutable_data_ptr<bool>() + t * N,
                   truncated.mutable_data_ptr<bool>() + t * N,
                   same_step ? final_obs.mutable_data_ptr<float>() + t * N * D : nullptr, nullptr});
  }
}

}  // namespace nostall::envs
