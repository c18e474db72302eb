"""The backend chooser: one vector env for an id, native, Gymnasium's or EnvPool's, each with
the same tensor interface (`env.torch`) and same-step autoreset."""

from __future__ import annotations

from nostall.envs.envpool_adapter import EnvPoolVectorEnv
from nostall.envs.gymnasium_adapter import GymnasiumVectorEnv
from nostall.envs.registry import ENVS
from nostall.envs.vector import make

BACKENDS = ("auto", "native", "gymnasium", "envpool")


def make_env(
    env_id: str, num_envs: int, seed: int = 0, backend: str = "auto", frame_stack: int = 0
):
    """nostall's native environment for `env_id` when it has one (backend "auto" or
    "native"), else Gymnasium's through GymnasiumVectorEnv ("auto" or "gymnasium"), or
    EnvPool's ("envpool", only when asked for); same-step autoreset in every case.
    frame_stack k > 1 stacks the last k frames of image observations (EnvPool's stack_num for
    EnvPool); 0 keeps the environment's own (EnvPool's Atari stacks 4, Gymnasium none)."""
    if backend not in BACKENDS:
        raise ValueError(f"env backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if frame_stack < 0:
        raise ValueError(f"frame_stack must be >= 0, got {frame_stack}")
    if backend == "envpool":
        return EnvPoolVectorEnv(env_id, num_envs, seed=seed, frame_stack=frame_stack)
    if backend == "native" or (backend == "auto" and env_id in ENVS):
        if env_id not in ENVS:
            raise ValueError(
                f"{env_id!r} is not a native environment (native: {', '.join(ENVS)}); "
                "use --env-backend gymnasium or auto"
            )
        if frame_stack > 1:
            raise ValueError(
                f"frame_stack applies to image observations; {env_id} observes a vector"
            )
        return make(env_id, num_envs, seed=seed, autoreset_mode="SameStep")
    return GymnasiumVectorEnv(env_id, num_envs, seed=seed, frame_stack=frame_stack)
