// The engine's vector environment: num_envs copies of one environment stepped as a batch, with
// Gymnasium's time limit and autoreset semantics, synchronously (step) or asynchronously
// (send / recv, EnvPool-style). It knows no specific environment: VecEnvOf<Dynamics> plugs in
// one through the small static interface described in envs/README-style comment below.
//
// A Dynamics type provides:
//   static EnvSpec spec();
//   struct State;                                   // the exact simulator state
//   static void reset(Rng&, State&);                // draw a start state
//   static Transition step(State&, const Action&);  // advance one step (no time limit)
//   static void observe(const State&, float* obs);  // obs_dim floats
//   static void export_state(const State&, double*) / import_state(const double*, State&);
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "envs/core/rng.h"
#include "envs/core/spec.h"
#include "envs/core/thread_pool.h"

namespace nostall::envs {

// Gymnasium's vector autoreset modes (gymnasium.vector.AutoresetMode).
enum class AutoresetMode : int64_t { kNextStep = 0, kSameStep = 1 };

struct EnvConfig {
  int64_t num_envs;
  int64_t num_threads;
  uint64_t seed;
  AutoresetMode autoreset_mode;
  int64_t batch_size;         // results per recv()
  int64_t max_episode_steps;  // time limit; the spec's default unless overridden
};

// Caller-owned output rows for a batch of environments.
struct StepOutput {
  float* obs;        // [rows, obs_dim]
  double* reward;    // [rows]
  bool* terminated;  // [rows]
  bool* truncated;   // [rows]
  float* final_obs;  // [rows, obs_dim], same-step autoreset only (else null)
  int64_t* env_ids;  // [rows], recv only (else null)
};

class VecEnv {
 public:
  VecEnv(EnvSpec spec, const EnvConfig& config);
  virtual ~VecEnv() = default;

  const EnvSpec& spec() const { return spec_; }
  const EnvConfig& config() const { return config_; }
  int64_t num_envs() const { return config_.num_envs; }

  // Validates every action before any environment moves, so a bad batch leaves all intact.
  // Discrete actions are int64 [num], continuous float32 [num, action_dim].
  void check_actions(const void* actions, int64_t num) const;

  // Resets every environment (reseeding env i with seed + i when seed >= 0); writes obs.
  void reset(int64_t seed, float* obs);
  void step(const void* actions, const StepOutput& out);

  // Asynchronous stepping: send queues one step per listed env; recv returns batch_size
  // results in completion order.
  void send(const void* actions, const int64_t* env_ids, int64_t num);
  void recv(const StepOutput& out);

  void get_state(double* out) const;
  void set_state(const double* in);

  // Everything needed to resume exactly: per env, the generator state, the step count within
  // the episode, the pending-reset flag, and the simulator state's bits (int64 words).
  int64_t checkpoint_words() const { return num_envs() * (6 + spec_.state_dim); }
  void save_checkpoint(int64_t* out) const;
  void load_checkpoint(const int64_t* in);

  // A failure in a context that cannot throw (a host function on a CUDA stream) is recorded
  // here and raised by the next call.
  void defer_error(std::string message);
  void raise_deferred_error();

  // Opaque per-environment resources of a device backend (the CUDA step's pinned staging
  // buffers), released with the environment.
  std::shared_ptr<void>& device_staging() { return device_staging_; }

 protected:
  virtual void reset_env(int64_t i) = 0;
  virtual Transition step_env(int64_t i, const Action& a) = 0;
  virtual void observe_env(int64_t i, float* obs) const = 0;
  virtual void export_env(int64_t i, double* out) const = 0;
  virtual void import_env(int64_t i, const double* in) = 0;

  Rng& rng(int64_t i) { return rngs_[static_cast<size_t>(i)]; }

  // Runs the queued asynchronous steps and joins the workers. Derived classes call it first in
  // their destructor: a queued step calls their virtual functions and reads their state.
  void stop_workers() { pool_.reset(); }

 private:
  Action action_at(const void* actions, int64_t row) const;
  // One environment, one step, with time limit and autoreset; writes row `row` of `out`.
  void step_one(int64_t i, const Action& a, const StepOutput& out, int64_t row);
  void start_episode(int64_t i);
  void require_idle(const char* what) const;

  EnvSpec spec_;
  EnvConfig config_;
  std::vector<Rng> rngs_;
  std::vector<int64_t> elapsed_;
  std::vector<uint8_t> needs_reset_;

  // Asynchronous mode: per-env action copies and result slots, and the completion queue.
  std::vector<int64_t> slot_index_actions_;
  std::vector<float> slot_value_actions_;
  std::vector<float> slot_obs_, slot_final_obs_;
  std::vector<double> slot_reward_;
  std::vector<uint8_t> slot_terminated_, slot_truncated_, in_flight_;
  mutable std::mutex async_mutex_;
  std::condition_variable completed_cv_;
  std::deque<int64_t> completed_;
  int64_t pending_ = 0;

  std::mutex error_mutex_;
  std::string deferred_error_;

  // Serialises synchronous calls: a CUDA stream's host function may step while Python calls.
  mutable std::mutex call_mutex_;
  std::shared_ptr<void> device_staging_;

  std::unique_ptr<ThreadPool> pool_;  // last: joined first, while the state above still lives
};

template <class Dynamics>
class VecEnvOf final : public VecEnv {
 public:
  explicit VecEnvOf(const EnvConfig& config)
      : VecEnv(Dynamics::spec(), config), states_(static_cast<size_t>(config.num_envs)) {}
  ~VecEnvOf() override { stop_workers(); }

 protected:
  void reset_env(int64_t i) override { Dynamics::reset(rng(i), states_[i]); }
  Transition step_env(int64_t i, const Action& a) override { return Dynamics::step(states_[i], a); }
  void observe_env(int64_t i, float* obs) const override { Dynamics::observe(states_[i], obs); }
  void export_env(int64_t i, double* out) const override {
    Dynamics::export_state(states_[i], out);
  }
  void import_env(int64_t i, const double* in) override { Dynamics::import_state(in, states_[i]); }

 private:
  std::vector<typename Dynamics::State> states_;
};

}  // namespace nostall::envs
