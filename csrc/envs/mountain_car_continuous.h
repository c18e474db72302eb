// MountainCarContinuous-v0, step for step as Gymnasium 1.x's
// classic_control/continuous_mountain_car.py. Its state is float64 after reset and float32 after
// every step, and its arithmetic mixes float32 actions with Python floats; NpScalar mirrors
// NumPy's promotion of each operation so the results match to the bit.
#pragma once

#include <cmath>

#include "envs/core/numpy_math.h"
#include "envs/core/numpy_scalar.h"
#include "envs/core/rng.h"
#include "envs/core/spec.h"

namespace nostall::envs {

struct MountainCarContinuous {
  struct State {
    double position, velocity;
    bool float32;  // the state array is float32 once the environment has stepped
  };

  static EnvSpec spec() { return {"MountainCarContinuous-v0", 2, 3, false, 0, 1, 999}; }

  static void reset(Rng& rng, State& s) { s = {rng.uniform(-0.6, -0.4), 0.0, false}; }

  static Transition step(State& s, const Action& a) {
    using N = NpScalar;
    const auto stored = [&](double v) {
      return s.float32 ? N::f32(static_cast<float>(v)) : N::f64(v);
    };
    N position = stored(s.position);
    N velocity = stored(s.velocity);
    const N action = N::f32(a.values[0]);
    // force = min(max(action[0], min_action), max_action), with Python's max/min keeping the
    // first argument on ties.
    N force = action;
    if (N::py(-1.0) > force) force = N::py(-1.0);
    if (N::py(1.0) < force) force = N::py(1.0);
    const N cos_term = N::py(0.0025) * N::py(std::cos((N::py(3) * position).value));
    velocity = velocity + (force * N::py(0.0015) - cos_term);
    if (velocity > N::py(0.07)) velocity = N::py(0.07);
    if (velocity < N::py(-0.07)) velocity = N::py(-0.07);
    position = position + velocity;
    if (position > N::py(0.6)) position = N::py(0.6);
    if (position < N::py(-1.2)) position = N::py(-1.2);
    if (position == N::py(-1.2) && velocity < N::py(0)) velocity = N::py(0);
    const bool terminated = position >= N::py(0.45) && velocity >= N::py(0);
    const double a0 = static_cast<double>(a.values[0]);
    const double reward = (terminated ? 100.0 : 0.0) - numpy_square(a0) * 0.1;
    s = {static_cast<float>(position.value), static_cast<float>(velocity.value), true};
    return {reward, terminated};
  }

  static void observe(const State& s, float* obs) {
    obs[0] = static_cast<float>(s.position);
    obs[1] = static_cast<float>(s.velocity);
  }

  static void export_state(const State& s, double* out) {
    out[0] = s.position;
    out[1] = s.velocity;
    out[2] = s.float32 ? 1.0 : 0.0;
  }

  static void import_state(const double* in, State& s) { s = {in[0], in[1], in[2] != 0.0}; }
};

}  // namespace nostall::envs
