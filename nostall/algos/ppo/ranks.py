"""`--trainers M` for PPO and APPO: rank 0 (the driver's trainer, trainer.py) and ranks
1..M-1 (nostall.runtime.distributed's Ray actors), each built from rank 0's agent, optimizer and
generator and running the same update on its share of every minibatch. M = 1 does nothing."""

from __future__ import annotations

import copy
import functools

import torch

from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.update import ppo_update
from nostall.envs.layout import slot_layout
from nostall.optim import ClippedAdam
from nostall.runtime.device import DeviceChunks
from nostall.runtime.storage import Chunk


class TrainerRanks:
    """Ranks 1..M-1 of `--trainers M` (nostall.runtime.distributed), or nothing to do for M = 1."""

    def __init__(self, args: PPOConfig, agent, optimizer, generator, advantage_fn, env):
        self.args, self.ranks = args, None
        if args.trainers > 1:  # rank 0's state, for the ranks to start from
            self._state = {
                "agent": copy.deepcopy(agent).cpu(),  # sync: once, the ranks' starting weights
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "layout": slot_layout(env),
                "device": str(next(agent.parameters()).device),
            }
            self._build = functools.partial(build_rank, args, advantage_fn)
            self._optimizer = optimizer

    def __enter__(self) -> TrainerRanks:
        if self.args.trainers > 1:
            from nostall.runtime import distributed  # torch.distributed: only for ranks

            self.ranks = distributed.TrainerRanks(
                self.args.trainers, self._build, self._state, self._optimizer
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.ranks is not None:
            self.ranks.close()

    def dispatch(self, chunk: Chunk, lr: float) -> None:
        if self.ranks is not None:
            self.ranks.dispatch(chunk, lr)

    def wait(self) -> None:
        if self.ranks is not None:
            self.ranks.wait()


def build_rank(args: PPOConfig, advantage_fn, state: dict):
    """A trainer rank's agent, optimizer, learning rate, generator and update, from rank 0's
    state (in the rank's process)."""
    device = torch.device(state["device"])
    agent = state["agent"].to(device)
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = ClippedAdam(agent.parameters(), lr=lr, max_grad_norm=args.max_grad_norm, eps=1e-5)
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    generator = torch.Generator(device)
    generator.set_state(state["generator"])
    return agent, optimizer, lr, generator, RankUpdate(args, advantage_fn, state["layout"], device)


class RankUpdate:
    """One iteration's update on a rank: the targets, then its shard of every minibatch."""

    def __init__(self, args: PPOConfig, advantage_fn, layout: dict, device: torch.device):
        self.args, self.advantage_fn, self.device = args, advantage_fn, device
        self.chunk = Chunk.empty(
            args.num_steps,
            layout["num_envs"],
            layout["obs_dim"],
            layout["action_shape"],
            layout["discrete"],
            obs_dtype=layout["obs_dtype"],
        )

    def empty_chunk(self) -> Chunk:
        return self.chunk

    def __call__(self, agent, optimizer, chunk: Chunk, generator, rank: tuple[int, int]) -> None:
        chunk = DeviceChunks(chunk, self.device).to_device(chunk)
        targets = self.advantage_fn(agent, chunk, self.args)
        ppo_update(agent, optimizer, chunk, targets, self.args, generator, rank)
