// MountainCar-v0, step for step as Gymnasium 1.x's classic_control/mountain_car.py.
#pragma once

#include <algorithm>
#include <cmath>

#include "envs/core/rng.h"
#include "envs/core/spec.h"

namespace nostall::envs {

struct MountainCar {
  struct State {
    double position, velocity;
  };

  static constexpr double kMinPosition = -1.2;
  static constexpr double kMaxPosition = 0.6;
  static constexpr double kMaxSpeed = 0.07;
  static constexpr double kGoalPosition = 0.5;
  static constexpr double kGoalVelocity = 0.0;
  static constexpr double kForce = 0.001;
  static constexpr double kGravity = 0.0025;

  static EnvSpec spec() { return {"MountainCar-v0", 2, 2, true, 3, 1, 200}; }

  static void reset(Rng& rng, State& s) {
    s.position = rng.uniform(-0.6, -0.4);
    s.velocity = 0.0;
  }

  static Transition step(State& s, const Action& a) {
    const double dv =
        static_cast<double>(a.index - 1) * kForce + std::cos(3 * s.position) * (-kGravity);
    double velocity = std::min(std::max(s.velocity + dv, -kMaxSpeed), kMaxSpeed);
    double position = std::min(std::max(s.position + velocity, kMinPosition), kMaxPosition);
    if (position == kMinPosition && velocity < 0) velocity = 0.0;
    s = {position, velocity};
    return {-1.0, position >= kGoalPosition && velocity >= kGoalVelocity};
  }

  static void observe(const State& s, float* obs) {
    obs[0] = static_cast<float>(s.position);
    obs[1] = static_cast<float>(s.velocity);
  }

  static void export_state(const State& s, double* out) {
    out[0] = s.position;
    out[1] = s.velocity;
  }

  static void import_state(const double* in, State& s) { s = {in[0], in[1]}; }
};

}  // namespace nostall::envs
