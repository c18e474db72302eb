// CartPole-v1, step for step as Gymnasium 1.x's classic_control/cartpole.py (Euler integrator,
// float64 state, float32 observations, reward 1 per step, 500-step time limit).
#pragma once

#include <cmath>

#include "envs/core/rng.h"
#include "envs/core/spec.h"

namespace nostall::envs {

struct CartPole {
  struct State {
    double x, x_dot, theta, theta_dot;
  };

  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;
  static constexpr double kXThreshold = 2.4;
  static double theta_threshold() { return 12 * 2 * M_PI / 360; }

  static EnvSpec spec() { return {"CartPole-v1", 4, 4, true, 2, 1, 500}; }

  static void reset(Rng& rng, State& s) {
    s.x = rng.uniform(-0.05, 0.05);
    s.x_dot = rng.uniform(-0.05, 0.05);
    s.theta = rng.uniform(-0.05, 0.05);
    s.theta_dot = rng.uniform(-0.05, 0.05);
  }

  static Transition step(State& s, const Action& a) {
    const double force = a.index == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(s.theta);
    const double sintheta = std::sin(s.theta);
    const double temp =
        (force + kPoleMassLength * (s.theta_dot * s.theta_dot) * sintheta) / kTotalMass;
    const double thetaacc =
        (kGravity * sintheta - costheta * temp) /
        (kLength * (4.0 / 3.0 - kMassPole * (costheta * costheta) / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    s.x = s.x + kTau * s.x_dot;
    s.x_dot = s.x_dot + kTau * xacc;
    s.theta = s.theta + kTau * s.theta_dot;
    s.theta_dot = s.theta_dot + kTau * thetaacc;
    const double limit = theta_threshold();
    const bool terminated =
        s.x < -kXThreshold || s.x > kXThreshold || s.theta < -limit || s.theta > limit;
    return {1.0, terminated};
  }

  static void observe(const State& s, float* obs) {
    obs[0] = static_cast<float>(s.x);
    obs[1] = static_cast<float>(s.x_dot);
    obs[2] = static_cast<float>(s.theta);
    obs[3] = static_cast<float>(s.theta_dot);
  }

  static void export_state(const State& s, double* out) {
    out[0] = s.x;
    out[1] = s.x_dot;
    out[2] = s.theta;
    out[3] = s.theta_dot;
  }

  static void import_state(const double* in, State& s) { s = {in[0], in[1], in[2], in[3]}; }
};

}  // namespace nostall::envs
