#include "envs/core/registry.h"

#include <torch/headeronly/util/Exception.h>

#include <mutex>
#include <sstream>
#include <unordered_map>

namespace nostall::envs {

namespace {

struct OpenEnvs {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<VecEnv>> by_handle;
  int64_t next_handle = 1;
};

OpenEnvs& open_envs() {
  static OpenEnvs* envs = new OpenEnvs();  // never destroyed: ops may run during interpreter exit
  return *envs;
}

}  // namespace

const EnvType& find_env_type(const std::string& id) {
  for (const EnvType& t : env_types()) {
    if (t.spec.id == id) return t;
  }
  std::ostringstream known;
  for (const EnvType& t : env_types()) known << " " << t.spec.id;
  STD_TORCH_CHECK(false, "unknown environment id '", id, "'; known ids:", known.str());
}

int64_t open_env(std::shared_ptr<VecEnv> env) {
  OpenEnvs& envs = open_envs();
  std::lock_guard<std::mutex> lock(envs.mutex);
  const int64_t handle = envs.next_handle++;
  envs.by_handle.emplace(handle, std::move(env));
  return handle;
}

std::shared_ptr<VecEnv> env_for(int64_t handle) {
  OpenEnvs& envs = open_envs();
  std::lock_guard<std::mutex> lock(envs.mutex);
  const auto it = envs.by_handle.find(handle);
  STD_TORCH_CHECK(it != envs.by_handle.end(), "environment handle ", handle,
                  " is closed or was never opened");
  return it->second;
}

void close_env(int64_t handle) {
  std::shared_ptr<VecEnv> env;
  {
    OpenEnvs& envs = open_envs();
    std::lock_guard<std::mutex> lock(envs.mutex);
    const auto it = envs.by_handle.find(handle);
    STD_TORCH_CHECK(it != envs.by_handle.end(), "environment handle ", handle,
                    " is closed or was never opened");
    env = std::move(it->second);
    envs.by_handle.erase(it);
  }
  // `env` is released here, outside the lock: joining its threads must not block other envs.
}

}  // namespace nostall::envs
