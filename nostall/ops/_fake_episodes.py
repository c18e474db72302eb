"""Fake kernel of episode_update (a mutating op: it returns nothing), with the checks of
csrc/ops/episodes.h."""

import torch

from nostall import _native  # noqa: F401  (loads the native library first)
from nostall.ops._checks import _fail


@torch.library.register_fake("nostall::episode_update")
def _episode_update_fake(reward, done, running_return, running_length, returns, lengths, finished):
    if reward.dim() not in (1, 2) or reward.dtype != torch.float64:
        _fail("reward must be a float64 [N] or [T, N] tensor")
    n = reward.shape[-1]
    if done.shape != reward.shape or done.dtype != torch.bool:
        _fail("done must be a bool tensor of reward's shape")
    if running_return.shape != (n,) or running_return.dtype != torch.float64:
        _fail(f"running_return must be a float64 [{n}] tensor, matching reward")
    if running_length.shape != (n,) or running_length.dtype != torch.int64:
        _fail(f"running_length must be an int64 [{n}] tensor, matching reward")
    if returns.dim() != 1 or returns.shape[0] < 1 or returns.dtype != torch.float64:
        _fail("returns must be a float64 [C] tensor with C >= 1")
    if lengths.shape != returns.shape or lengths.dtype != torch.int64:
        _fail(f"lengths must be an int64 [{returns.shape[0]}] tensor, matching returns")
    if finished.dim() != 0 or finished.dtype != torch.int64:
        _fail("finished must be an int64 scalar tensor")
    for t in (done, running_return, running_length, returns, lengths, finished):
        if t.device != reward.device:
            _fail("episode_update: every tensor must be on the device of reward")
