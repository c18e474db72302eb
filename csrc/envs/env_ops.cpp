// CPU kernels of the environment operators. The ops are thin: argument checks, output
// allocation, and one call into the engine, which writes straight into the outputs.
#include "envs/env_ops.h"

#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>

#include "envs/core/registry.h"

namespace nostall::envs {

namespace {

Tensor cpu_empty(std::vector<int64_t> sizes, ScalarType dtype) {
  return torch::stable::empty(sizes, dtype);
}

}  // namespace

// More threads than this only adds contention (and each is a real thread).
constexpr int64_t kMaxThreads = 256;

int64_t env_create(std::string env_id, int64_t num_envs, int64_t num_threads, int64_t seed,
                   int64_t autoreset_mode, int64_t batch_size, int64_t max_episode_steps) {
  const EnvType& type = find_env_type(env_id);
  STD_TORCH_CHECK(num_envs >= 1, "num_envs must be at least 1, got ", num_envs);
  STD_TORCH_CHECK(num_threads >= 1 && num_threads <= kMaxThreads, "num_threads must lie in [1, ",
                  kMaxThreads, "], got ", num_threads);
  STD_TORCH_CHECK(seed >= 0, "seed must be non-negative, got ", seed);
  STD_TORCH_CHECK(autoreset_mode == 0 || autoreset_mode == 1,
                  "autoreset_mode must be 0 (next-step) or 1 (same-step), got ", autoreset_mode);
  if (batch_size < 0) batch_size = num_envs;
  STD_TORCH_CHECK(batch_size >= 1 && batch_size <= num_envs, "batch_size must lie in [1, ",
                  num_envs, "], got ", batch_size);
  STD_TORCH_CHECK(max_episode_steps >= 1 || max_episode_steps == -1,
                  "max_episode_steps must be at least 1 (or -1: the environment's), got ",
                  max_episode_steps);
  if (max_episode_steps == -1) max_episode_steps = type.spec.max_episode_steps;
  STD_TORCH_CHECK(max_episode_steps >= 1, "max_episode_steps must be at least 1, got ",
                  max_episode_steps);
  const EnvConfig config{num_envs,
                         num_threads,
                         static_cast<uint64_t>(seed),
                         static_cast<AutoresetMode>(autoreset_mode),
                         batch_size,
                         max_episode_steps};
  return open_env(std::shared_ptr<VecEnv>(type.make(config)));
}

void env_close(int64_t handle) { close_env(handle); }

std::vector<int64_t> env_describe(std::string env_id) {
  const EnvSpec& s = find_env_type(env_id).spec;
  return {s.obs_dim,     s.state_dim,  s.discrete ? 1 : 0,
          s.num_actions, s.action_dim, s.max_episode_steps};
}

Tensor env_reset(int64_t handle, int64_t seed) {
  STD_TORCH_CHECK(seed >= -1, "seed must be non-negative (or -1: keep the generators), got ", seed);
  const auto env = env_for(handle);
  Tensor obs = cpu_empty({env->num_envs(), env->spec().obs_dim}, ScalarType::Float);
  env->reset(seed, obs.mutable_data_ptr<float>());
  return obs;
}

StepTensors env_step_cpu(int64_t handle, Tensor actions) {
  const auto env = env_for(handle);
  check_action_tensor(*env, actions, env->num_envs());
  actions = actions.is_contiguous() ? actions : torch::stable::contiguous(actions);
  StepTensors out = new_step_outputs(*env, actions, env->num_envs());
  env->step(actions.const_data_ptr(), output_pointers(out));
  return out;
}

void env_step_into_cpu(int64_t handle, Tensor actions, Tensor obs, Tensor reward, Tensor terminated,
                       Tensor truncated, Tensor final_obs) {
  const auto env = env_for(handle);
  check_action_tensor(*env, actions, env->num_envs());
  StepTensors out{obs, reward, terminated, truncated, final_obs};
  check_step_outputs(*env, actions, out);
  actions = actions.is_contiguous() ? actions : torch::stable::contiguous(actions);
  env->step(actions.const_data_ptr(), output_pointers(out));
}

void env_send_cpu(int64_t handle, Tensor actions, Tensor env_ids) {
  const auto env = env_for(handle);
  STD_TORCH_CHECK(env_ids.scalar_type() == ScalarType::Long && env_ids.dim() == 1,
                  "env_ids must be a 1-D int64 tensor");
  STD_TORCH_CHECK(env_ids.is_cpu(), "env_ids must be a CPU tensor");
  check_action_tensor(*env, actions, env_ids.size(0));
  actions = actions.is_contiguous() ? actions : torch::stable::contiguous(actions);
  env_ids = env_ids.is_contiguous() ? env_ids : torch::stable::contiguous(env_ids);
  env->send(actions.const_data_ptr(), env_ids.const_data_ptr<int64_t>(), env_ids.size(0));
}

RecvTensors env_recv(int64_t handle) {
  const auto env = env_for(handle);
  const int64_t rows = env->config().batch_size;
  Tensor cpu = cpu_empty({0}, ScalarType::Float);
  StepTensors step = new_step_outputs(*env, cpu, rows);
  Tensor env_ids = cpu_empty({rows}, ScalarType::Long);
  StepOutput ptrs = output_pointers(step);
  ptrs.env_ids = env_ids.mutable_data_ptr<int64_t>();
  env->recv(ptrs);
  auto& [obs, reward, terminated, truncated, final_obs] = step;
  return {obs, reward, terminated, truncated, final_obs, env_ids};
}

Tensor env_get_state(int64_t handle) {
  const auto env = env_for(handle);
  Tensor state = cpu_empty({env->num_envs(), env->spec().state_dim}, ScalarType::Double);
  env->get_state(state.mutable_data_ptr<double>());
  return state;
}

void env_set_state_cpu(int64_t handle, Tensor state) {
  const auto env = env_for(handle);
  STD_TORCH_CHECK(state.scalar_type() == ScalarType::Double && state.dim() == 2 &&
                      state.size(0) == env->num_envs() && state.size(1) == env->spec().state_dim,
                  "state must be float64 [", env->num_envs(), ", ", env->spec().state_dim, "]");
  state = state.is_contiguous() ? state : torch::stable::contiguous(state);
  env->set_state(state.const_data_ptr<double>());
}

Tensor env_save(int64_t handle) {
  const auto env = env_for(handle);
  Tensor out = cpu_empty({env->checkpoint_words()}, ScalarType::Long);
  env->save_checkpoint(out.mutable_data_ptr<int64_t>());
  return out;
}

void env_load_cpu(int64_t handle, Tensor checkpoint) {
  const auto env = env_for(handle);
  STD_TORCH_CHECK(checkpoint.scalar_type() == ScalarType::Long && checkpoint.dim() == 1 &&
                      checkpoint.size(0) == env->checkpoint_words(),
                  env->spec().id, ": checkpoint must be int64 [", env->checkpoint_words(),
                  "] (saved from an environment of the same id and num_envs)");
  checkpoint = checkpoint.is_contiguous() ? checkpoint : torch::stable::contiguous(checkpoint);
  env->load_checkpoint(checkpoint.const_data_ptr<int64_t>());
}

}  // namespace nostall::envs
