"""The rollout side in its own process: same results as the thread at staleness 0, learning
when asynchronous, failures surfaced with the child's traceback, no process left behind."""

import functools

import pytest
import torch
import torch.multiprocessing as mp

import nostall.envs
from nostall.algos import appo, ppo
from nostall.algos.ppo.agent import ActorCritic
from nostall.algos.ppo.setup import make_transport
from nostall.algos.ppo.state import restore_rollout
from nostall.runtime import RuntimeStopped, WorkerEpisodes
from tests.runtime.env_loops import cartpole, env_loop


def test_process_backend_reproduces_the_thread_backend_at_staleness_0():
    common = dict(total_timesteps=8 * 1024, log_interval=2, watch_syncs=False)
    thread = ppo.train(ppo.PPOConfig(**common))
    process = ppo.train(ppo.PPOConfig(**common, backend="process"))
    assert thread.curve and [c[2] for c in thread.curve] == [c[2] for c in process.curve]


def test_asynchronous_ppo_learns_cartpole_with_a_rollout_process():
    args = appo.APPOConfig(
        total_timesteps=300_000, stop_when_solved=True, log_interval=5, backend="process"
    )
    result = appo.train(args)
    assert result.solved_at is not None, result.curve[-5:]


def _exploding_agent(env):
    raise ValueError("cannot build the policy")


def test_a_failure_in_the_rollout_process_reaches_the_trainer():
    env = nostall.envs.make("CartPole-v1", 4)
    agent = ActorCritic.for_env(env)
    runtime = env_loop(
        "process",
        agent,
        make_env=functools.partial(cartpole, 4),
        num_steps=8,
        make_agent=_exploding_agent,
    )
    with pytest.raises(RuntimeStopped, match="cannot build the policy"), runtime:
        runtime.next_chunk()
    assert mp.active_children() == []


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be thread, process or ray"):
        ppo.train(ppo.PPOConfig(backend="gpu"))
    assert torch.multiprocessing.active_children() == []


def test_a_checkpoint_loads_only_before_the_process_starts(tmp_path):
    # (Exact resume with this backend: tests/algos/ppo/test_trainers.py.)
    path = tmp_path / "c-{iteration}.pt"
    ppo.train(ppo.PPOConfig(backend="process", total_timesteps=2048, checkpoint=str(path)))
    state = ppo.load_checkpoint(tmp_path / "c-2.pt")
    assert {"env", "generator", "next_obs", "episodes", "queued"} <= set(state["runtime"])
    env = nostall.envs.make("CartPole-v1", 8, seed=0, autoreset_mode="SameStep")
    agent = ActorCritic.for_env(env, 64)
    runtime = make_transport(ppo.PPOConfig(backend="process"), env, agent)
    episodes = WorkerEpisodes(1, 8)
    with runtime, pytest.raises(RuntimeError, match="must come before the rollout process"):
        restore_rollout(runtime, episodes, state["runtime"], agent)
    assert torch.multiprocessing.active_children() == []
