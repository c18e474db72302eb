// What an environment is, as the engine and the Python side need to know it.
#pragma once

#include <cstdint>
#include <string>

namespace nostall::envs {

struct EnvSpec {
  std::string id;
  int64_t obs_dim;
  int64_t state_dim;    // doubles in the exported state (see VecEnv::get_state)
  bool discrete;        // discrete: one int64 action per env in [0, num_actions)
  int64_t num_actions;  // discrete only
  int64_t action_dim;   // continuous only: float32 actions [num_envs, action_dim]
  int64_t max_episode_steps;
};

// One step's outcome for one environment, before time limits and autoreset.
struct Transition {
  double reward;
  bool terminated;
};

// An action as the dynamics see it: an index for discrete spaces, a pointer to action_dim
// floats for continuous ones.
struct Action {
  int64_t index;
  const float* values;
};

}  // namespace nostall::envs
