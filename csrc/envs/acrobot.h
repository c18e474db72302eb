// Acrobot-v1, step for step as Gymnasium 1.x's classic_control/acrobot.py: "book" dynamics,
// one RK4 step of dt = 0.2 over the state augmented with the torque, angles wrapped to
// [-pi, pi], velocities bounded. The operations keep Gymnasium's order (and its pow(x, 2) for
// `x ** 2` on NumPy scalars), so float64 results match to the bit.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>

#include "envs/core/numpy_math.h"
#include "envs/core/rng.h"
#include "envs/core/spec.h"

namespace nostall::envs {

struct Acrobot {
  using Vec = std::array<double, 5>;  // theta1, theta2, dtheta1, dtheta2, torque
  struct State {
    double theta1, theta2, dtheta1, dtheta2;
  };

  static constexpr double kDt = 0.2;
  static constexpr double kM1 = 1.0, kM2 = 1.0, kL1 = 1.0, kLc1 = 0.5, kLc2 = 0.5, kI = 1.0;
  static constexpr double kMaxVel1 = 4 * M_PI;
  static constexpr double kMaxVel2 = 9 * M_PI;

  static EnvSpec spec() { return {"Acrobot-v1", 6, 4, true, 3, 1, 500}; }

  static void reset(Rng& rng, State& s) {
    // Gymnasium draws float64 and stores the state as float32.
    const auto draw = [&] {
      return static_cast<double>(static_cast<float>(rng.uniform(-0.1, 0.1)));
    };
    s.theta1 = draw();
    s.theta2 = draw();
    s.dtheta1 = draw();
    s.dtheta2 = draw();
  }

  static Vec dsdt(const Vec& y) {
    const double a = y[4], theta1 = y[0], theta2 = y[1], dtheta1 = y[2], dtheta2 = y[3];
    const double g = 9.8;
    const double d1 = kM1 * (kLc1 * kLc1) +
                      kM2 * (kL1 * kL1 + kLc2 * kLc2 + 2 * kL1 * kLc2 * std::cos(theta2)) + kI + kI;
    const double d2 = kM2 * (kLc2 * kLc2 + kL1 * kLc2 * std::cos(theta2)) + kI;
    const double phi2 = kM2 * kLc2 * g * std::cos(theta1 + theta2 - M_PI / 2.0);
    const double phi1 = -kM2 * kL1 * kLc2 * numpy_square(dtheta2) * std::sin(theta2) -
                        2 * kM2 * kL1 * kLc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (kM1 * kLc1 + kM2 * kL1) * g * std::cos(theta1 - M_PI / 2) + phi2;
    const double ddtheta2 =
        (a + d2 / d1 * phi1 - kM2 * kL1 * kLc2 * numpy_square(dtheta1) * std::sin(theta2) - phi2) /
        (kM2 * (kLc2 * kLc2) + kI - numpy_square(d2) / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    return {dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0};
  }

  static double wrap(double x, double m, double big_m) {
    const double diff = big_m - m;
    while (x > big_m) x = x - diff;
    while (x < m) x = x + diff;
    return x;
  }

  static double bound(double x, double m, double big_m) { return std::min(std::max(x, m), big_m); }

  static Transition step(State& s, const Action& a) {
    static constexpr double kTorque[3] = {-1.0, 0.0, 1.0};
    const Vec y0 = {s.theta1, s.theta2, s.dtheta1, s.dtheta2, kTorque[a.index]};
    const double dt = kDt - 0.0;  // t[1] - t[0]
    const double dt2 = dt / 2.0;
    const auto axpy = [](const Vec& y, double h, const Vec& k) {
      Vec out;
      for (size_t i = 0; i < out.size(); ++i) out[i] = y[i] + h * k[i];
      return out;
    };
    const Vec k1 = dsdt(y0);
    const Vec k2 = dsdt(axpy(y0, dt2, k1));
    const Vec k3 = dsdt(axpy(y0, dt2, k2));
    const Vec k4 = dsdt(axpy(y0, dt, k3));
    Vec y1;
    for (size_t i = 0; i < y1.size(); ++i) {
      y1[i] = y0[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    }
    s.theta1 = wrap(y1[0], -M_PI, M_PI);
    s.theta2 = wrap(y1[1], -M_PI, M_PI);
    s.dtheta1 = bound(y1[2], -kMaxVel1, kMaxVel1);
    s.dtheta2 = bound(y1[3], -kMaxVel2, kMaxVel2);
    const bool terminated = -std::cos(s.theta1) - std::cos(s.theta2 + s.theta1) > 1.0;
    return {terminated ? 0.0 : -1.0, terminated};
  }

  static void observe(const State& s, float* obs) {
    obs[0] = static_cast<float>(std::cos(s.theta1));
    obs[1] = static_cast<float>(std::sin(s.theta1));
    obs[2] = static_cast<float>(std::cos(s.theta2));
    obs[3] = static_cast<float>(std::sin(s.theta2));
    obs[4] = static_cast<float>(s.dtheta1);
    obs[5] = static_cast<float>(s.dtheta2);
  }

  static void export_state(const State& s, double* out) {
    out[0] = s.theta1;
    out[1] = s.theta2;
    out[2] = s.dtheta1;
    out[3] = s.dtheta2;
  }

  static void import_state(const double* in, State& s) { s = {in[0], in[1], in[2], in[3]}; }
};

}  // namespace nostall::envs
