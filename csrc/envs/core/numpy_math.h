// NumPy's scalar `x ** 2` calls libm's pow, whose result is not always x * x to the last bit
// (about 1 in 1,300 random doubles differ here). Compilers fold pow(x, 2) into x * x, so the
// exponent is hidden from them to keep Gymnasium's exact values.
#pragma once

#include <cmath>

namespace nostall::envs {

inline double numpy_square(double x) {
  volatile double two = 2.0;
  return std::pow(x, two);
}

inline float numpy_square(float x) {
  volatile float two = 2.0f;
  return std::pow(x, two);
}

}  // namespace nostall::envs
