"""A PPO / APPO run's checkpoint state: what `snapshot` takes at a chunk boundary and
`load_checkpoint` validates on the way back (in the format of nostall.train.checkpoint)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from nostall.train import checkpoint

# Arguments a resume may change; every other one must match the checkpoint's. The backend and
# device may change: the checkpoint format does not depend on them.
RESUMABLE = checkpoint.RUN_RESUMABLE | {"total_timesteps", "solved_return", "device"}


def snapshot(agent, optimizer, lr, runtime, generator, iteration, result) -> dict:
    """Taken inside the runtime's boundary, after this iteration's publish: the rollout side
    is between chunks, so its state (and the chunks it filled ahead) is exact on every
    backend."""
    return {
        "agent": {k: v.detach().clone() for k, v in agent.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "lr": lr.clone(),
        "runtime": runtime.state_dict(),
        "trainer_generator": generator.get_state(),
        "iteration": iteration,
        "curve": [list(point) for point in result.curve],
    }


def load_checkpoint(path: str | Path, algorithm: str = "ppo", args=None) -> dict:
    """The state of a checkpoint of `algorithm`; with `args`, refuses (CheckpointError, a
    ValueError) a resume whose arguments conflict with the saved ones, naming the fields."""
    saved_args, state = checkpoint.load(path, algorithm)
    if args is not None:
        checkpoint.check_compatible(saved_args, asdict(args), RESUMABLE)
    for key in ("agent", "optimizer", "lr", "runtime", "trainer_generator", "iteration", "curve"):
        if key not in state:
            raise checkpoint.CheckpointError(f"checkpoint {path} has no {key!r}")
    iteration = state["iteration"]
    if not isinstance(iteration, int) or iteration < 1:
        raise checkpoint.CheckpointError(f"checkpoint {path}: bad iteration {iteration!r}")
    checkpoint.check_finite(state["agent"], path)
    return state
