// Kernels of the environment operators (schemas in csrc/registration.cpp). Every op takes the
// integer handle of an environment opened by env_create.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "envs/core/vec_env.h"
#include "envs/step_tensors.h"

namespace nostall::envs {

using RecvTensors = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

int64_t env_create(std::string env_id, int64_t num_envs, int64_t num_threads, int64_t seed,
                   int64_t autoreset_mode, int64_t batch_size, int64_t max_episode_steps);
void env_close(int64_t handle);
std::vector<int64_t> env_describe(std::string env_id);
Tensor env_reset(int64_t handle, int64_t seed);
StepTensors env_step_cpu(int64_t handle, Tensor actions);
void env_step_into_cpu(int64_t handle, Tensor actions, Tensor obs, Tensor reward, Tensor terminated,
                       Tensor truncated, Tensor final_obs);
void env_send_cpu(int64_t handle, Tensor actions, Tensor env_ids);
RecvTensors env_recv(int64_t handle);
Tensor env_get_state(int64_t handle);
void env_set_state_cpu(int64_t handle, Tensor state);
Tensor env_save(int64_t handle);
void env_load_cpu(int64_t handle, Tensor checkpoint);

void env_rollout_cpu(int64_t handle, Tensor obs, Tensor actions, Tensor log_probs, Tensor values,
                     Tensor rewards, Tensor terminated, Tensor truncated, Tensor final_obs,
                     Tensor noise, std::vector<Tensor> actor_weights,
                     std::vector<Tensor> actor_biases, std::vector<Tensor> critic_weights,
                     std::vector<Tensor> critic_biases, std::optional<Tensor> log_std,
                     std::string activation);
// Refuses CUDA tensors with a clear message: the fused rollout runs on the CPU.
void env_rollout_cuda(int64_t handle, Tensor obs, Tensor actions, Tensor log_probs, Tensor values,
                      Tensor rewards, Tensor terminated, Tensor truncated, Tensor final_obs,
                      Tensor noise, std::vector<Tensor> actor_weights,
                      std::vector<Tensor> actor_biases, std::vector<Tensor> critic_weights,
                      std::vector<Tensor> critic_biases, std::optional<Tensor> log_std,
                      std::string activation);

StepTensors env_step_cuda(int64_t handle, Tensor actions);
void env_step_into_cuda(int64_t handle, Tensor actions, Tensor obs, Tensor reward,
                        Tensor terminated, Tensor truncated, Tensor final_obs);

}  // namespace nostall::envs
