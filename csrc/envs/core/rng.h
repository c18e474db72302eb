// Per-environment random number generator: xoshiro256** seeded through splitmix64.
//
// Each environment owns one, seeded from (seed, env index), so trajectories depend on the seed
// alone, never on how environments are spread over threads.
#pragma once

#include <cstdint>

namespace nostall::envs {

class Rng {
 public:
  Rng() { seed(0); }

  void seed(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& s : state_) s = splitmix64(x);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // The raw generator state, for checkpoints.
  void save(uint64_t* out) const {
    for (int i = 0; i < 4; ++i) out[i] = state_[i];
  }
  void load(const uint64_t* in) {
    for (int i = 0; i < 4; ++i) state_[i] = in[i];
  }

  // Uniform in [low, high), 53 random bits.
  double uniform(double low, double high) {
    const double unit = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return low + (high - low) * unit;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  uint64_t state_[4];
};

}  // namespace nostall::envs
