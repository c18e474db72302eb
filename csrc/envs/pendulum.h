// Pendulum-v1, step for step as Gymnasium 1.x's classic_control/pendulum.py. The torque is a
// float32 action, and Gymnasium's NumPy arithmetic keeps some of its terms in float32; those
// terms are computed in float here too, so results match to the bit.
#pragma once

#include <algorithm>
#include <cmath>

#include "envs/core/numpy_math.h"
#include "envs/core/rng.h"
#include "envs/core/spec.h"

namespace nostall::envs {

struct Pendulum {
  struct State {
    double theta, theta_dot;
  };

  static constexpr double kMaxSpeed = 8.0;
  static constexpr float kMaxTorque = 2.0f;
  static constexpr double kDt = 0.05;
  static constexpr double kG = 10.0;
  static constexpr double kM = 1.0;
  static constexpr double kL = 1.0;

  static EnvSpec spec() { return {"Pendulum-v1", 3, 2, false, 0, 1, 200}; }

  // NumPy's float64 remainder: the result takes the sign of the divisor.
  static double floor_mod(double a, double b) {
    double mod = std::fmod(a, b);
    if (mod != 0.0) {
      if ((b < 0) != (mod < 0)) mod += b;
    } else {
      mod = std::copysign(0.0, b);
    }
    return mod;
  }

  static double angle_normalize(double x) { return floor_mod(x + M_PI, 2 * M_PI) - M_PI; }

  static void reset(Rng& rng, State& s) {
    s.theta = rng.uniform(-M_PI, M_PI);
    s.theta_dot = rng.uniform(-1.0, 1.0);
  }

  static Transition step(State& s, const Action& a) {
    const float u = std::min(std::max(a.values[0], -kMaxTorque), kMaxTorque);
    const float torque_cost = 0.001f * numpy_square(u);  // float32 in Gymnasium
    const double costs =
        numpy_square(angle_normalize(s.theta)) + 0.1 * numpy_square(s.theta_dot) + torque_cost;
    const float torque_acc = 3.0f * u;  // 3 / (m l^2) * u, float32 in Gymnasium
    double new_theta_dot = s.theta_dot + (3 * kG / (2 * kL) * std::sin(s.theta) + torque_acc) * kDt;
    new_theta_dot = std::min(std::max(new_theta_dot, -kMaxSpeed), kMaxSpeed);
    s.theta = s.theta + new_theta_dot * kDt;
    s.theta_dot = new_theta_dot;
    return {-costs, false};
  }

  static void observe(const State& s, float* obs) {
    obs[0] = static_cast<float>(std::cos(s.theta));
    obs[1] = static_cast<float>(std::sin(s.theta));
    obs[2] = static_cast<float>(s.theta_dot);
  }

  static void export_state(const State& s, double* out) {
    out[0] = s.theta;
    out[1] = s.theta_dot;
  }

  static void import_state(const double* in, State& s) { s = {in[0], in[1]}; }
};

}  // namespace nostall::envs
