"""A PPO / APPO run's checkpoint state: what `snapshot` takes at a chunk boundary and
`load_checkpoint` validates on the way back (in the format of nostall.train.checkpoint)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from nostall.runtime.episodes import WorkerEpisodes
from nostall.runtime.protocol import Transport
from nostall.runtime.storage import chunk_state, load_chunk_state
from nostall.train import checkpoint

# Arguments a resume may change; every other one must match the checkpoint's. The backend and
# device may change: the checkpoint format does not depend on them.
RESUMABLE = checkpoint.RUN_RESUMABLE | {"total_timesteps", "solved_return", "device"}
SIDE_KEYS = ("env", "generator", "next_obs")  # EnvSide.state_dict's


def rollout_state(loop: Transport, episodes: WorkerEpisodes) -> dict:
    """Inside the loop's boundary: the side's state (worker 0's envs, generator, next
    observation), the episodes kept from the chunks received, and the loop's own (versions,
    weights, queued chunks), in keys every transport restores."""
    state = {
        **loop.fill_state(),
        "episodes": episodes.trackers[0].state_dict(),
        **loop.state_dict(chunk_state),
    }
    if len(episodes.trackers) > 1:
        state["worker_episodes"] = episodes.state_dict()
    return state


def restore_rollout(loop: Transport, episodes: WorkerEpisodes, state: dict, agent) -> None:
    """Before the loop starts: a checkpoint's rollout state, of any transport."""
    loop.load_state_dict(state, agent, load_chunk_state)
    loop.load_fill_state({key: state[key] for key in SIDE_KEYS})
    episodes.load_state_dict(state.get("worker_episodes") or [state["episodes"]])


def snapshot(agent, optimizer, lr, rollout: dict, generator, iteration, result) -> dict:
    """Taken inside the loop's boundary, after this iteration's publish: the rollout side is
    between chunks, so its state (`rollout`, rollout_state's, with the chunks it filled ahead)
    is exact on every backend."""
    return {
        "agent": {k: v.detach().clone() for k, v in agent.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "lr": lr.clone(),
        "runtime": rollout,
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
