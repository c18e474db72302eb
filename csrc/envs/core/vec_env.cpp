#include "envs/core/vec_env.h"

#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace nostall::envs {

namespace {
// Below this many environments per thread, handing work to other threads costs more than it
// saves: the caller steps them alone.
constexpr int64_t kMinEnvsPerThread = 64;
}  // namespace

VecEnv::VecEnv(EnvSpec spec, const EnvConfig& config)
    : spec_(std::move(spec)),
      config_(config),
      rngs_(static_cast<size_t>(config.num_envs)),
      elapsed_(static_cast<size_t>(config.num_envs), 0),
      needs_reset_(static_cast<size_t>(config.num_envs), 1),
      slot_index_actions_(static_cast<size_t>(config.num_envs), 0),
      slot_value_actions_(static_cast<size_t>(config.num_envs * spec_.action_dim), 0.0f),
      slot_obs_(static_cast<size_t>(config.num_envs * spec_.obs_dim), 0.0f),
      slot_final_obs_(config.autoreset_mode == AutoresetMode::kSameStep
                          ? static_cast<size_t>(config.num_envs * spec_.obs_dim)
                          : 0,
                      0.0f),
      slot_reward_(static_cast<size_t>(config.num_envs), 0.0),
      slot_terminated_(static_cast<size_t>(config.num_envs), 0),
      slot_truncated_(static_cast<size_t>(config.num_envs), 0),
      in_flight_(static_cast<size_t>(config.num_envs), 0),
      pool_(std::make_unique<ThreadPool>(config.num_threads > 1 ? config.num_threads : 0)) {
  for (int64_t i = 0; i < config_.num_envs; ++i) rng(i).seed(config_.seed + i);
}

void VecEnv::check_actions(const void* actions, int64_t num) const {
  if (spec_.discrete) {
    const int64_t* a = static_cast<const int64_t*>(actions);
    for (int64_t i = 0; i < num; ++i) {
      STD_TORCH_CHECK(a[i] >= 0 && a[i] < spec_.num_actions, spec_.id, ": actions must lie in [0, ",
                      spec_.num_actions, "), got ", a[i], " at index ", i);
    }
  } else {
    const float* a = static_cast<const float*>(actions);
    for (int64_t i = 0; i < num * spec_.action_dim; ++i) {
      STD_TORCH_CHECK(!std::isnan(a[i]), spec_.id, ": actions must not be NaN (index ",
                      i / spec_.action_dim, ")");
    }
  }
}

Action VecEnv::action_at(const void* actions, int64_t row) const {
  if (spec_.discrete) return {static_cast<const int64_t*>(actions)[row], nullptr};
  return {0, static_cast<const float*>(actions) + row * spec_.action_dim};
}

void VecEnv::start_episode(int64_t i) {
  reset_env(i);
  elapsed_[i] = 0;
  needs_reset_[i] = 0;
}

void VecEnv::require_idle(const char* what) const {
  std::lock_guard<std::mutex> lock(async_mutex_);
  STD_TORCH_CHECK(pending_ == 0 && completed_.empty(), spec_.id, ": ", what,
                  " while asynchronous steps are outstanding; recv() them first");
}

void VecEnv::reset(int64_t seed, float* obs) {
  raise_deferred_error();
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("reset()");
  for (int64_t i = 0; i < num_envs(); ++i) {
    if (seed >= 0) rng(i).seed(static_cast<uint64_t>(seed) + i);
    start_episode(i);
    observe_env(i, obs + i * spec_.obs_dim);
  }
}

void VecEnv::step_one(int64_t i, const Action& a, const StepOutput& out, int64_t row) {
  float* obs = out.obs + row * spec_.obs_dim;
  if (needs_reset_[i]) {
    // Next-step autoreset: this call resets instead of stepping, and reports nothing happened.
    start_episode(i);
    out.reward[row] = 0.0;
    out.terminated[row] = false;
    out.truncated[row] = false;
    observe_env(i, obs);
    return;
  }
  const Transition t = step_env(i, a);
  elapsed_[i] += 1;
  const bool truncated = elapsed_[i] >= config_.max_episode_steps;
  out.reward[row] = t.reward;
  out.terminated[row] = t.terminated;
  out.truncated[row] = truncated;
  const bool done = t.terminated || truncated;
  if (config_.autoreset_mode == AutoresetMode::kSameStep) {
    float* final_obs = out.final_obs + row * spec_.obs_dim;
    if (done) {
      observe_env(i, final_obs);
      start_episode(i);
    } else {
      std::fill(final_obs, final_obs + spec_.obs_dim, 0.0f);
    }
  } else if (done) {
    needs_reset_[i] = 1;
  }
  observe_env(i, obs);
}

void VecEnv::step(const void* actions, const StepOutput& out) {
  raise_deferred_error();
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("step()");
  check_actions(actions, num_envs());
  const int64_t max_parts = std::max<int64_t>(1, num_envs() / kMinEnvsPerThread);
  const int64_t parts = std::min<int64_t>(config_.num_threads, max_parts);
  pool_->parallel_for(num_envs(), parts, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) step_one(i, action_at(actions, i), out, i);
  });
}

void VecEnv::send(const void* actions, const int64_t* env_ids, int64_t num) {
  raise_deferred_error();
  // Held for the whole call, as step() holds it: a send from one thread cannot slip in while
  // another thread's step() is stepping the same environments.
  std::lock_guard<std::mutex> call(call_mutex_);
  check_actions(actions, num);
  {
    std::lock_guard<std::mutex> lock(async_mutex_);
    for (int64_t k = 0; k < num; ++k) {
      const int64_t i = env_ids[k];
      STD_TORCH_CHECK(i >= 0 && i < num_envs(), spec_.id, ": env_ids must lie in [0, ", num_envs(),
                      "), got ", i);
      STD_TORCH_CHECK(!in_flight_[i], spec_.id, ": env ", i,
                      " was sent an action and has not been received yet");
      for (int64_t j = 0; j < k; ++j) {
        STD_TORCH_CHECK(env_ids[j] != i, spec_.id, ": env_ids lists env ", i, " twice");
      }
    }
    for (int64_t k = 0; k < num; ++k) {
      const int64_t i = env_ids[k];
      in_flight_[i] = 1;
      if (spec_.discrete) {
        slot_index_actions_[i] = static_cast<const int64_t*>(actions)[k];
      } else {
        const float* src = static_cast<const float*>(actions) + k * spec_.action_dim;
        std::copy(src, src + spec_.action_dim, slot_value_actions_.data() + i * spec_.action_dim);
      }
    }
    pending_ += num;
  }
  for (int64_t k = 0; k < num; ++k) {
    const int64_t i = env_ids[k];
    auto task = [this, i] {
      const Action a = spec_.discrete
                           ? Action{slot_index_actions_[i], nullptr}
                           : Action{0, slot_value_actions_.data() + i * spec_.action_dim};
      double reward;
      bool terminated, truncated;
      const StepOutput slot{
          slot_obs_.data() + i * spec_.obs_dim,
          &reward,
          &terminated,
          &truncated,
          slot_final_obs_.empty() ? nullptr : slot_final_obs_.data() + i * spec_.obs_dim,
          nullptr};
      step_one(i, a, slot, 0);
      std::lock_guard<std::mutex> lock(async_mutex_);
      slot_reward_[i] = reward;
      slot_terminated_[i] = terminated;
      slot_truncated_[i] = truncated;
      completed_.push_back(i);
      completed_cv_.notify_all();
    };
    if (pool_->num_workers() == 0) {
      task();  // one thread: step now, in send order
    } else {
      pool_->submit(task);
    }
  }
}

void VecEnv::recv(const StepOutput& out) {
  raise_deferred_error();
  const int64_t batch = config_.batch_size;
  std::unique_lock<std::mutex> lock(async_mutex_);
  STD_TORCH_CHECK(pending_ >= batch, spec_.id, ": recv() needs ", batch, " sent steps, but only ",
                  pending_, " are outstanding; send() actions first");
  completed_cv_.wait(lock, [&] { return static_cast<int64_t>(completed_.size()) >= batch; });
  for (int64_t row = 0; row < batch; ++row) {
    const int64_t i = completed_.front();
    completed_.pop_front();
    std::copy_n(slot_obs_.data() + i * spec_.obs_dim, spec_.obs_dim, out.obs + row * spec_.obs_dim);
    if (out.final_obs != nullptr) {
      std::copy_n(slot_final_obs_.data() + i * spec_.obs_dim, spec_.obs_dim,
                  out.final_obs + row * spec_.obs_dim);
    }
    out.reward[row] = slot_reward_[i];
    out.terminated[row] = slot_terminated_[i];
    out.truncated[row] = slot_truncated_[i];
    out.env_ids[row] = i;
    in_flight_[i] = 0;
  }
  pending_ -= batch;
}

void VecEnv::get_state(double* out) const {
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("get_state()");
  for (int64_t i = 0; i < num_envs(); ++i) export_env(i, out + i * spec_.state_dim);
}

void VecEnv::set_state(const double* in) {
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("set_state()");
  for (int64_t i = 0; i < num_envs(); ++i) import_env(i, in + i * spec_.state_dim);
}

void VecEnv::save_checkpoint(int64_t* out) const {
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("save_checkpoint()");
  std::vector<double> state(static_cast<size_t>(spec_.state_dim));
  for (int64_t i = 0; i < num_envs(); ++i) {
    int64_t* row = out + i * (6 + spec_.state_dim);
    rngs_[i].save(reinterpret_cast<uint64_t*>(row));
    row[4] = elapsed_[i];
    row[5] = needs_reset_[i];
    export_env(i, state.data());
    std::memcpy(row + 6, state.data(), state.size() * sizeof(double));
  }
}

void VecEnv::load_checkpoint(const int64_t* in) {
  std::lock_guard<std::mutex> call(call_mutex_);
  require_idle("load_checkpoint()");
  std::vector<double> state(static_cast<size_t>(spec_.state_dim));
  // Validate every row before changing anything: a damaged state is refused whole, and an
  // out-of-range step count could overflow the next step's increment.
  for (int64_t i = 0; i < num_envs(); ++i) {
    const int64_t* row = in + i * (6 + spec_.state_dim);
    STD_TORCH_CHECK(row[0] != 0 || row[1] != 0 || row[2] != 0 || row[3] != 0, spec_.id,
                    ": loaded state of env ", i, " has an all-zero generator state");
    STD_TORCH_CHECK(row[4] >= 0 && row[4] <= config_.max_episode_steps, spec_.id,
                    ": loaded state of env ", i, " has step count ", row[4], " outside [0, ",
                    config_.max_episode_steps, "]");
    STD_TORCH_CHECK(row[5] == 0 || row[5] == 1, spec_.id, ": loaded state of env ", i,
                    " has reset flag ", row[5], " (must be 0 or 1)");
    std::memcpy(state.data(), row + 6, state.size() * sizeof(double));
    for (int64_t d = 0; d < spec_.state_dim; ++d) {
      STD_TORCH_CHECK(std::isfinite(state[d]), spec_.id, ": loaded state of env ", i,
                      " is not finite (", state[d], " at ", d, ")");
    }
  }
  for (int64_t i = 0; i < num_envs(); ++i) {
    const int64_t* row = in + i * (6 + spec_.state_dim);
    rngs_[i].load(reinterpret_cast<const uint64_t*>(row));
    elapsed_[i] = row[4];
    needs_reset_[i] = static_cast<uint8_t>(row[5] != 0);
    std::memcpy(state.data(), row + 6, state.size() * sizeof(double));
    import_env(i, state.data());
  }
}

void VecEnv::defer_error(std::string message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (deferred_error_.empty()) deferred_error_ = std::move(message);
}

void VecEnv::raise_deferred_error() {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    message.swap(deferred_error_);
  }
  STD_TORCH_CHECK(message.empty(), message);
}

}  // namespace nostall::envs
