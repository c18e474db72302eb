"""Native vectorised environments: C++ classic-control environments that match Gymnasium step
for step, stepped through ordered custom operators."""

from nostall.envs.registry import ENVS, env_info
from nostall.envs.vector import EnvBatch, EnvStep, TorchVectorEnv, VectorEnv, make

__all__ = ["ENVS", "EnvBatch", "EnvStep", "TorchVectorEnv", "VectorEnv", "env_info", "make"]
