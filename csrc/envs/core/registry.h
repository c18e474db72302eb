// Environment types by id, and open environments by integer handle. A handle is what the
// custom operators take: an int survives torch.compile and crosses the C++/Python boundary for
// free; the object it names lives here until it is closed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "envs/core/vec_env.h"

namespace nostall::envs {

using EnvFactory = std::unique_ptr<VecEnv> (*)(const EnvConfig&);

struct EnvType {
  EnvSpec spec;
  EnvFactory make;
};

// Every environment type (defined in envs.cpp, a line each).
const std::vector<EnvType>& env_types();

// The type registered under `id`; throws, listing the known ids, for an unknown one.
const EnvType& find_env_type(const std::string& id);

int64_t open_env(std::shared_ptr<VecEnv> env);
// The open environment behind `handle`; throws for an unknown or closed handle.
std::shared_ptr<VecEnv> env_for(int64_t handle);
// Forgets the handle; the environment (and its threads) goes when its last user lets go.
void close_env(int64_t handle);

}  // namespace nostall::envs
