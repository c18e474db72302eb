// Every environment type nostall provides, a line each.
#include "envs/acrobot.h"
#include "envs/cartpole.h"
#include "envs/core/registry.h"
#include "envs/mountain_car.h"
#include "envs/mountain_car_continuous.h"
#include "envs/pendulum.h"

namespace nostall::envs {

namespace {
template <class Dynamics>
std::unique_ptr<VecEnv> make(const EnvConfig& config) {
  return std::make_unique<VecEnvOf<Dynamics>>(config);
}
}  // namespace

const std::vector<EnvType>& env_types() {
  static const std::vector<EnvType> types = {
      {CartPole::spec(), &make<CartPole>},
      {Pendulum::spec(), &make<Pendulum>},
      {Acrobot::spec(), &make<Acrobot>},
      {MountainCar::spec(), &make<MountainCar>},
      {MountainCarContinuous::spec(), &make<MountainCarContinuous>},
  };
  return types;
}

}  // namespace nostall::envs
