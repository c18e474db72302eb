// The stream-ordered environment step for CUDA actions. Nothing here blocks the host:
//   1. the actions are copied device-to-pinned-host on the current stream;
//   2. the CPU step runs as a host function enqueued on that stream (cudaLaunchHostFunc);
//   3. the outputs are copied pinned-host-to-device on the stream;
//   4. a last host function returns the staging buffers to the environment's pool.
// So a policy on the GPU and the environments on the CPU overlap, and the whole sequence can be
// captured in a CUDA graph (captured buffers then belong to the graph and are never reused).
// An error inside the host function (an out-of-range action) cannot be thrown there: it is
// recorded on the environment and raised by its next call.
#include <cuda_runtime.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <mutex>
#include <thread>
#include <vector>

#include "common/cuda_launch.cuh"
#include "envs/core/registry.h"
#include "envs/env_ops.h"

namespace nostall::envs {

namespace {

void check_cuda(cudaError_t err, const char* what) {
  STD_TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

// Pinned host memory for one step's actions and outputs.
struct Staging {
  std::shared_ptr<VecEnv> env;  // held while a step is in flight
  char* block = nullptr;
  void* actions = nullptr;
  StepOutput out{};
  size_t action_bytes = 0, obs_bytes = 0, final_obs_bytes = 0, rows = 0;

  Staging(const VecEnv& e) {
    const EnvSpec& s = e.spec();
    rows = static_cast<size_t>(e.num_envs());
    action_bytes = s.discrete ? rows * sizeof(int64_t) : rows * s.action_dim * sizeof(float);
    obs_bytes = rows * s.obs_dim * sizeof(float);
    final_obs_bytes = e.config().autoreset_mode == AutoresetMode::kSameStep ? obs_bytes : 0;
    const size_t reward_bytes = rows * sizeof(double);
    const size_t total = action_bytes + 2 * obs_bytes + reward_bytes + 2 * rows * sizeof(bool) + 64;
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&block), total, cudaHostAllocDefault),
               "cudaHostAlloc");
    char* p = block;
    // reward first: the only 8-byte type, so it stays aligned.
    out.reward = reinterpret_cast<double*>(p);
    p += reward_bytes;
    out.obs = reinterpret_cast<float*>(p);
    p += obs_bytes;
    out.final_obs = final_obs_bytes ? reinterpret_cast<float*>(p) : nullptr;
    p += final_obs_bytes;
    actions = p;
    p += action_bytes;
    out.terminated = reinterpret_cast<bool*>(p);
    p += rows;
    out.truncated = reinterpret_cast<bool*>(p);
  }
  ~Staging() { cudaFreeHost(block); }
};

struct StagingPool {
  std::mutex mutex;
  std::vector<Staging*> free;
  ~StagingPool() {
    for (Staging* s : free) delete s;
  }
};

StagingPool& pool_of(VecEnv& env) {
  static std::mutex create_mutex;
  std::lock_guard<std::mutex> lock(create_mutex);
  auto& slot = env.device_staging();
  if (!slot) slot = std::make_shared<StagingPool>();
  return *static_cast<StagingPool*>(slot.get());
}

Staging* acquire(VecEnv& env) {
  StagingPool& pool = pool_of(env);
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.free.empty()) {
      Staging* s = pool.free.back();
      pool.free.pop_back();
      return s;
    }
  }
  return new Staging(env);
}

void CUDART_CB run_step(void* data) {
  Staging* s = static_cast<Staging*>(data);
  try {
    s->env->step(s->actions, s->out);
  } catch (const std::exception& e) {
    s->env->defer_error(e.what());
  }
}

void CUDART_CB release(void* data) {
  Staging* s = static_cast<Staging*>(data);
  std::shared_ptr<VecEnv> env = std::move(s->env);
  {
    StagingPool& pool = pool_of(*env);
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(s);
  }
  if (env.use_count() == 1) {
    // The environment was closed with this step in flight: this is its last owner. Its
    // staging buffers are freed with cudaFreeHost, which a host function must not call:
    // destroy it on a thread of its own.
    std::thread([doomed = std::move(env)]() mutable { doomed.reset(); }).detach();
  }
}

// Enqueues one step of `env` on the current stream: actions in, `device` outputs out.
void enqueue_step(const std::shared_ptr<VecEnv>& env, const Tensor& actions,
                  const StepOutput& device) {
  const cudaStream_t stream = current_stream(actions);
  Staging* s = acquire(*env);
  s->env = env;
  const size_t rows = s->rows;
  check_cuda(cudaMemcpyAsync(s->actions, actions.const_data_ptr(), s->action_bytes,
                             cudaMemcpyDeviceToHost, stream),
             "copying actions to the host");
  check_cuda(cudaLaunchHostFunc(stream, run_step, s), "cudaLaunchHostFunc(step)");
  const auto h2d = [&](void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
               "copying step outputs to the device");
  };
  h2d(device.obs, s->out.obs, s->obs_bytes);
  h2d(device.reward, s->out.reward, rows * sizeof(double));
  h2d(device.terminated, s->out.terminated, rows * sizeof(bool));
  h2d(device.truncated, s->out.truncated, rows * sizeof(bool));
  h2d(device.final_obs, s->out.final_obs, s->final_obs_bytes);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusNone) {
    check_cuda(cudaLaunchHostFunc(stream, release, s), "cudaLaunchHostFunc(release)");
  }
  // Under capture the buffers belong to the graph, which replays into them: never released.
}

std::shared_ptr<VecEnv> checked_env(int64_t handle, Tensor& actions) {
  auto env = env_for(handle);
  env->raise_deferred_error();
  check_action_tensor(*env, actions, env->num_envs());
  actions = actions.is_contiguous() ? actions : torch::stable::contiguous(actions);
  return env;
}

}  // namespace

StepTensors env_step_cuda(int64_t handle, Tensor actions) {
  torch::stable::accelerator::DeviceGuard guard(actions.get_device_index());
  const auto env = checked_env(handle, actions);
  StepTensors out = new_step_outputs(*env, actions, env->num_envs());
  enqueue_step(env, actions, output_pointers(out));
  return out;
}

void env_step_into_cuda(int64_t handle, Tensor actions, Tensor obs, Tensor reward,
                        Tensor terminated, Tensor truncated, Tensor final_obs) {
  torch::stable::accelerator::DeviceGuard guard(actions.get_device_index());
  const auto env = checked_env(handle, actions);
  StepTensors out{obs, reward, terminated, truncated, final_obs};
  check_step_outputs(*env, actions, out);
  enqueue_step(env, actions, output_pointers(out));
}

void env_rollout_cuda(int64_t handle, Tensor obs, Tensor actions, Tensor log_probs, Tensor values,
                      Tensor rewards, Tensor terminated, Tensor truncated, Tensor final_obs,
                      Tensor noise, std::vector<Tensor> actor_weights,
                      std::vector<Tensor> actor_biases, std::vector<Tensor> critic_weights,
                      std::vector<Tensor> critic_biases, std::optional<Tensor> log_std,
                      std::string activation) {
  env_for(handle);  // a closed handle says so first
  STD_TORCH_CHECK(false,
                  "env_rollout runs the environments and the policy on the CPU: every tensor "
                  "must be a CPU tensor (got a CUDA one). With a policy on a GPU, step through "
                  "env_step, which is stream-ordered and never blocks the host.");
}

}  // namespace nostall::envs
