/* The physical limit for the environment benchmark: plain single-threaded C loops stepping
 * CartPole and Pendulum with the same dynamics, time limits and resets as the native
 * environments, over caller-owned buffers (no allocation, no Python). Built by bench_sps.py. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static double uniform(double low, double high) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return low + (high - low) * ((double)(rng_state >> 11) * 0x1.0p-53);
}

/* state: [n, 4] doubles; obs: [n, 4] floats; actions: [steps, n] int64. */
void cartpole_run(double* state, int64_t* elapsed, const int64_t* actions, float* obs,
                  double* reward, bool* terminated, bool* truncated, int64_t n, int64_t steps) {
  const double theta_limit = 12 * 2 * M_PI / 360;
  for (int64_t k = 0; k < steps; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double* s = state + 4 * i;
      const double force = actions[k * n + i] == 1 ? 10.0 : -10.0;
      const double c = cos(s[2]), sn = sin(s[2]);
      const double temp = (force + 0.05 * s[3] * s[3] * sn) / 1.1;
      const double thetaacc = (9.8 * sn - c * temp) / (0.5 * (4.0 / 3.0 - 0.1 * c * c / 1.1));
      const double xacc = temp - 0.05 * thetaacc * c / 1.1;
      s[0] += 0.02 * s[1];
      s[1] += 0.02 * xacc;
      s[2] += 0.02 * s[3];
      s[3] += 0.02 * thetaacc;
      const bool term = s[0] < -2.4 || s[0] > 2.4 || s[2] < -theta_limit || s[2] > theta_limit;
      const bool trunc = ++elapsed[i] >= 500;
      reward[i] = 1.0;
      terminated[i] = term;
      truncated[i] = trunc;
      if (term || trunc) {
        for (int j = 0; j < 4; ++j) s[j] = uniform(-0.05, 0.05);
        elapsed[i] = 0;
      }
      for (int j = 0; j < 4; ++j) obs[4 * i + j] = (float)s[j];
    }
  }
}

/* state: [n, 2] doubles; obs: [n, 3] floats; actions: [steps, n] floats. */
void pendulum_run(double* state, int64_t* elapsed, const float* actions, float* obs,
                  double* reward, bool* terminated, bool* truncated, int64_t n, int64_t steps) {
  for (int64_t k = 0; k < steps; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double* s = state + 2 * i;
      float u = actions[k * n + i];
      u = u < -2.0f ? -2.0f : (u > 2.0f ? 2.0f : u);
      double th = fmod(s[0] + M_PI, 2 * M_PI);
      if (th < 0) th += 2 * M_PI;
      th -= M_PI;
      reward[i] = -(th * th + 0.1 * s[1] * s[1] + 0.001f * u * u);
      double thdot = s[1] + (15.0 * sin(s[0]) + 3.0f * u) * 0.05;
      thdot = thdot < -8.0 ? -8.0 : (thdot > 8.0 ? 8.0 : thdot);
      s[0] += thdot * 0.05;
      s[1] = thdot;
      terminated[i] = false;
      truncated[i] = ++elapsed[i] >= 200;
      if (truncated[i]) {
        s[0] = uniform(-M_PI, M_PI);
        s[1] = uniform(-1.0, 1.0);
        elapsed[i] = 0;
      }
      obs[3 * i] = (float)cos(s[0]);
      obs[3 * i + 1] = (float)sin(s[0]);
      obs[3 * i + 2] = (float)s[1];
    }
  }
}
