"""The thread transport over environments: staleness bound, failure propagation, clean shutdown."""

import threading
from types import SimpleNamespace

import pytest
import torch

import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, act
from nostall.runtime import RuntimeStopped
from tests.runtime.env_loops import env_loop


def _runtime(staleness=0, act_fn=act, num_steps=8):
    env = nostall.envs.make("CartPole-v1", 4, seed=0, autoreset_mode="SameStep")
    agent = ActorCritic.for_env(env)
    loop = env_loop(
        "thread", agent, env=env, act_fn=act_fn, num_steps=num_steps, staleness=staleness
    )
    return loop, agent


def _blocked_at_the_bound(runtime) -> tuple[threading.Event, threading.Event]:
    """Events around the rollout side's wait for a policy version: `blocked` when it waits for
    one the trainer has not published, `resumed` when such a wait returns."""
    loop = runtime
    blocked, resumed = threading.Event(), threading.Event()
    wait_for = loop.weights.wait_for

    def watched(version, stop, *args, **kwargs):
        waits = version > loop.version
        if waits:
            blocked.set()
        wait_for(version, stop, *args, **kwargs)
        if waits and not stop.is_set():
            resumed.set()

    loop.weights.wait_for = watched
    return blocked, resumed


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_rollout_side_runs_at_most_staleness_versions_ahead(staleness):
    runtime, agent = _runtime(staleness)
    blocked, resumed = _blocked_at_the_bound(runtime)
    with runtime:
        assert blocked.wait(10)  # the trainer publishes nothing: the rollout side stops...
        assert runtime.chunks_collected == staleness + 1  # ...with the bound's chunks filled
        slot, chunk = runtime.next_chunk()
        assert chunk.version == 0
        runtime.release(slot)
        # A free slot alone does not let it run further ahead; the next version does.
        assert not resumed.wait(0.2) and runtime.chunks_collected == staleness + 1
        runtime.publish(agent)
        assert resumed.wait(10)


def test_synchronous_runtime_alternates_and_tags_versions():
    runtime, agent = _runtime(0)
    with runtime:
        for expected_version in range(4):
            slot, chunk = runtime.next_chunk()
            assert chunk.version == expected_version and runtime.lag(chunk) == 0
            runtime.release(slot)
            runtime.publish(agent)


def test_chunks_hold_the_steps_that_were_taken():
    runtime, agent = _runtime(0, num_steps=16)
    with runtime:
        slot, chunk = runtime.next_chunk()
        # Every recorded log-probability is that of the recorded action under the policy.
        log_prob, _ = agent.log_prob_entropy(chunk.obs[:-1], chunk.actions)
        torch.testing.assert_close(log_prob, chunk.log_probs)
        torch.testing.assert_close(agent.value(chunk.obs[:-1]), chunk.values)
        assert (chunk.rewards == 1.0).all()
        runtime.release(slot)


def test_a_rollout_failure_ends_the_trainers_wait_with_its_cause():
    calls = {"n": 0}

    def failing_act(agent, obs, generator):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("policy exploded")
        return act(agent, obs, generator)

    runtime, _ = _runtime(0, failing_act)
    raised = {}

    def trainer():
        try:
            with runtime:
                runtime.next_chunk()
        except RuntimeStopped as e:
            raised["error"] = e

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    thread.join(60)  # (a liveness bound, not a timing claim: without the failure it waits on)
    assert not thread.is_alive(), "the trainer's wait did not end with the rollout's failure"
    info = SimpleNamespace(value=raised["error"])
    assert isinstance(info.value.__cause__, ValueError)
    assert "policy exploded" in str(info.value.__cause__)
    assert info.value.__cause__.__traceback__ is not None


def test_a_trainer_failure_stops_the_rollout_thread():
    before = threading.active_count()
    runtime, _ = _runtime(1)
    with pytest.raises(KeyError), runtime:
        runtime.next_chunk()
        raise KeyError("trainer bug")
    assert threading.active_count() == before


def test_clean_shutdown_leaves_no_thread():
    before = threading.active_count()
    runtime, agent = _runtime(1)
    with runtime:
        slot, _ = runtime.next_chunk()
        runtime.release(slot)
        runtime.publish(agent)
    assert threading.active_count() == before


def test_bad_arguments():
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        _runtime(-1)
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        _runtime(0, num_steps=0)
