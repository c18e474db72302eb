// A plain C entry into the environment engine for the Gymnasium (NumPy) API's step.
//
// The custom op `env_step_into` is what compiled graphs and the tensor API call; through the
// dispatcher a call costs 10-13 us, where stepping 8 CartPoles takes well under one. The NumPy
// API's step writes into buffers the VectorEnv made once and checked then (dtype, shape,
// contiguity, all on the host), so it needs none of the op's per-call work: Python calls this
// function (ctypes) with the buffers' addresses. The engine's own checks (action range, NaN, a
// closed handle) still run, and their message comes back to be raised in Python.
#include <cstdint>
#include <cstring>
#include <exception>

#include "envs/core/registry.h"

namespace {

// Mirrors nostall/envs/host_step.py's ctypes Structure, field for field.
struct HostStep {
  const void* actions;
  float* obs;
  double* reward;
  bool* terminated;
  bool* truncated;
  float* final_obs;  // null without same-step autoreset
};

}  // namespace

// Steps every environment of `handle`. Returns how many finished (terminated or truncated), or
// -1 with the engine's message in `error` (NUL-terminated, cut to error_size).
extern "C" __attribute__((visibility("default"))) int64_t
nostall_env_step_host(int64_t handle, const HostStep* step, char* error, int64_t error_size) {
  try {
    const auto env = nostall::envs::env_for(handle);
    env->step(step->actions, {step->obs, step->reward, step->terminated, step->truncated,
                              step->final_obs, nullptr});
    int64_t done = 0;
    for (int64_t i = 0; i < env->num_envs(); ++i) {
      done += step->terminated[i] || step->truncated[i];
    }
    return done;
  } catch (const std::exception& e) {
    if (error_size > 0) {
      std::strncpy(error, e.what(), static_cast<size_t>(error_size - 1));
      error[error_size - 1] = '\0';
    }
    return -1;
  }
}
