"""Fake kernels and effect registration of the environment operators.

Every op that touches an environment is registered as an ORDERED effect: torch.compile then
keeps each call, in program order, even when its result is unused or identical to another
call's (a plain functional op would be dropped or merged). The fake kernels need each handle's
sizes, which VectorEnv records in OPEN when it opens an environment; the handle is a constant in
a compiled graph.
"""

from dataclasses import dataclass

import torch
from torch._library.effects import EffectType

from nostall import _native  # noqa: F401  (loads the native library)

EFFECTFUL_OPS = (
    "env_reset",
    "env_step",
    "env_step_into",
    "env_rollout",
    "env_send",
    "env_recv",
    "env_set_state",
    "env_save",
    "env_load",
    "env_close",
)


@dataclass(frozen=True)
class HandleSizes:
    num_envs: int
    obs_dim: int
    state_dim: int
    batch_size: int
    same_step: bool


OPEN: dict[int, HandleSizes] = {}


def _sizes(handle: int) -> HandleSizes:
    if handle not in OPEN:
        raise RuntimeError(f"environment handle {handle} is closed or was never opened")
    return OPEN[handle]


def _step_outputs(s: HandleSizes, rows: int, device: torch.device):
    return (
        torch.empty(rows, s.obs_dim, dtype=torch.float32, device=device),
        torch.empty(rows, dtype=torch.float64, device=device),
        torch.empty(rows, dtype=torch.bool, device=device),
        torch.empty(rows, dtype=torch.bool, device=device),
        torch.empty(rows if s.same_step else 0, s.obs_dim, dtype=torch.float32, device=device),
    )


@torch.library.register_fake("nostall::env_step")
def _env_step_fake(handle, actions):
    s = _sizes(handle)
    return _step_outputs(s, s.num_envs, actions.device)


@torch.library.register_fake("nostall::env_step_into")
def _env_step_into_fake(handle, actions, obs, reward, terminated, truncated, final_obs):
    _sizes(handle)


@torch.library.register_fake("nostall::env_rollout")
def _env_rollout_fake(
    handle,
    obs,
    actions,
    log_probs,
    values,
    rewards,
    terminated,
    truncated,
    final_obs,
    noise,
    actor_weights,
    actor_biases,
    critic_weights,
    critic_biases,
    log_std,
    activation,
):
    _sizes(handle)


@torch.library.register_fake("nostall::env_reset")
def _env_reset_fake(handle, seed):
    s = _sizes(handle)
    return torch.empty(s.num_envs, s.obs_dim, dtype=torch.float32)


@torch.library.register_fake("nostall::env_send")
def _env_send_fake(handle, actions, env_ids):
    _sizes(handle)


@torch.library.register_fake("nostall::env_recv")
def _env_recv_fake(handle):
    s = _sizes(handle)
    device = torch.device("cpu")
    ids = torch.empty(s.batch_size, dtype=torch.int64)
    return (*_step_outputs(s, s.batch_size, device), ids)


@torch.library.register_fake("nostall::env_get_state")
def _env_get_state_fake(handle):
    s = _sizes(handle)
    return torch.empty(s.num_envs, s.state_dim, dtype=torch.float64)


@torch.library.register_fake("nostall::env_set_state")
def _env_set_state_fake(handle, state):
    _sizes(handle)


@torch.library.register_fake("nostall::env_save")
def _env_save_fake(handle):
    s = _sizes(handle)
    return torch.empty(s.num_envs * (6 + s.state_dim), dtype=torch.int64)


@torch.library.register_fake("nostall::env_load")
def _env_load_fake(handle, checkpoint):
    _sizes(handle)


@torch.library.register_fake("nostall::env_close")
def _env_close_fake(handle):
    pass


for _name in EFFECTFUL_OPS:
    torch.library._register_effectful_op(f"nostall::{_name}", EffectType.ORDERED)
