"""The environment operators: ordered effects under torch.compile, async send/recv, seeding."""

import numpy as np
import pytest
import torch

import nostall.envs

ops = torch.ops.nostall


def _pair(env_id="CartPole-v1", num_envs=4, **kwargs):
    """Two identically seeded environments, one for eager and one for compiled runs."""
    a = nostall.envs.make(env_id, num_envs, seed=3, **kwargs)
    b = nostall.envs.make(env_id, num_envs, seed=3, **kwargs)
    a.torch.reset()
    b.torch.reset()
    return a, b


def _policy_actions(obs: torch.Tensor) -> torch.Tensor:
    return (obs[:, 2] + 0.1 * obs[:, 3] > 0).long()  # (N,) a simple balancing rule


def test_compiled_loop_of_eight_steps_gives_the_eager_trajectory():
    eager_env, compiled_env = _pair()
    torch._dynamo.reset()

    def rollout(env, obs):
        trajectory = []
        for _ in range(8):
            step = env.step(_policy_actions(obs))
            obs = step.obs
            trajectory.append(torch.cat([obs, step.reward.float()[:, None]], dim=1))
        return torch.stack(trajectory)

    obs0 = torch.as_tensor(eager_env.get_state()[:, :4], dtype=torch.float32)
    want = rollout(eager_env.torch, obs0)
    got = torch.compile(rollout, fullgraph=True)(compiled_env.torch, obs0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    np.testing.assert_array_equal(compiled_env.get_state(), eager_env.get_state())


def test_a_discarded_step_still_happens_and_identical_calls_are_two_steps():
    eager_env, compiled_env = _pair()
    actions = torch.ones(4, dtype=torch.long)
    torch._dynamo.reset()

    def twice(env, a):
        env.step(a)  # result discarded: must not be dead-code eliminated
        return env.step(a).obs  # identical call: must not be merged with the first

    want = twice(eager_env.torch, actions)
    got = torch.compile(twice, fullgraph=True)(compiled_env.torch, actions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    np.testing.assert_array_equal(compiled_env.get_state(), eager_env.get_state())


def test_steps_keep_their_order_inside_a_graph_that_needs_gradients():
    eager_env, compiled_env = _pair()
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)

    def loss_fn(env, policy, obs):
        total = torch.zeros(())
        for _ in range(3):
            logits = policy(obs)
            step = env.step(logits.argmax(-1))
            env.step(torch.zeros(4, dtype=torch.long))  # discarded, still a step
            total = total + (logits.log_softmax(-1)[:, 0] * step.reward.float()).sum()
            obs = step.obs
        return total

    obs0 = torch.zeros(4, 4)
    want = loss_fn(eager_env.torch, policy, obs0)
    want.backward()
    want_grad = policy.weight.grad.clone()
    policy.zero_grad()
    torch._dynamo.reset()
    got = torch.compile(loss_fn, fullgraph=True)(compiled_env.torch, policy, obs0)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(policy.weight.grad, want_grad)
    np.testing.assert_array_equal(compiled_env.get_state(), eager_env.get_state())


def test_opcheck_of_the_step_op():
    env = nostall.envs.make("Pendulum-v1", 3, seed=0)
    env.torch.reset()
    actions = torch.zeros(3, 1)
    # test_aot_dispatch_dynamic re-runs the op, which advances the environment: by design it
    # cannot hold for a stateful op, so the other default checks are run.
    torch.library.opcheck(
        ops.env_step.default,
        (env.handle, actions),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_same_seed_same_trajectories_whatever_the_thread_count():
    results = []
    for threads in (1, 2, 3):
        env = nostall.envs.make("Acrobot-v1", 300, num_threads=threads, seed=11)
        env.reset()
        rng = np.random.default_rng(0)
        rows = []
        for _ in range(100):
            obs, reward, term, trunc, _ = env.step(rng.integers(0, 3, size=300))
            rows.append((obs.copy(), reward.copy(), term.copy(), trunc.copy()))
        results.append(rows)
        env.close()
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)


def test_reset_with_seed_restarts_the_same_episodes():
    env = nostall.envs.make("CartPole-v1", 8, seed=0)
    first, _ = env.reset(seed=42)
    env.step(np.ones(8, dtype=np.int64))
    again, _ = env.reset(seed=42)
    np.testing.assert_array_equal(first, again)
    other, _ = env.reset(seed=43)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("num_threads", [1, 3])
def test_send_recv_matches_synchronous_stepping(num_threads):
    n = 12
    sync = nostall.envs.make("MountainCar-v0", n, seed=5)
    asyn = nostall.envs.make("MountainCar-v0", n, seed=5, num_threads=num_threads, batch_size=4)
    sync.reset()
    asyn.reset()
    rng = np.random.default_rng(1)
    for _ in range(30):
        actions = rng.integers(0, 3, size=n)
        obs, reward, term, trunc, _ = sync.step(actions)
        asyn.send(actions, np.arange(n))
        seen = []
        for _ in range(n // 4):
            b_obs, b_reward, b_term, b_trunc, info = asyn.recv()
            ids = info["env_id"]
            seen.extend(ids)
            np.testing.assert_array_equal(b_obs, obs[ids])
            np.testing.assert_array_equal(b_reward, reward[ids])
            np.testing.assert_array_equal(b_term, term[ids])
            np.testing.assert_array_equal(b_trunc, trunc[ids])
        assert sorted(seen) == list(range(n))


def test_recv_returns_whichever_environments_were_sent():
    env = nostall.envs.make("CartPole-v1", 6, seed=0, batch_size=2)
    env.reset()
    env.send(np.array([1, 0]), env_ids=[4, 1])
    _, _, _, _, info = env.recv()
    assert sorted(info["env_id"]) == [1, 4]


def test_torch_send_recv():
    env = nostall.envs.make("Pendulum-v1", 4, seed=0, batch_size=4)
    env.torch.reset()
    env.torch.send(torch.zeros(4, 1))
    batch = env.torch.recv()
    assert batch.obs.shape == (4, 3) and batch.env_ids.dtype == torch.int64
    assert sorted(batch.env_ids.tolist()) == [0, 1, 2, 3]


def test_get_and_set_state_round_trip():
    env = nostall.envs.make("MountainCarContinuous-v0", 3, seed=0)
    env.reset()
    env.step(np.zeros((3, 1), dtype=np.float32))
    state = env.get_state()
    obs, *_ = env.step(np.ones((3, 1), dtype=np.float32))
    env.set_state(state)
    again, *_ = env.step(np.ones((3, 1), dtype=np.float32))
    np.testing.assert_array_equal(obs, again)


def test_step_into_preallocated_rows_matches_step_and_compiles():
    eager_env, compiled_env = _pair("Acrobot-v1", 5)
    T = 6
    actions = torch.tensor([[(t + i) % 3 for i in range(5)] for t in range(T)])
    want = [eager_env.torch.step(actions[t]) for t in range(T)]
    buffers = compiled_env.torch.empty_step()
    obs_rows = torch.empty(T, 5, 6)

    def rollout(env, actions, buffers, obs_rows):
        for t in range(T):
            step = env.step(actions[t], out=buffers)
            obs_rows[t].copy_(step.obs)
        return obs_rows

    torch._dynamo.reset()
    got = torch.compile(rollout, fullgraph=True)(compiled_env.torch, actions, buffers, obs_rows)
    torch.testing.assert_close(got, torch.stack([w.obs for w in want]), rtol=0, atol=0)
    torch.testing.assert_close(buffers.reward, want[-1].reward, rtol=0, atol=0)
    np.testing.assert_array_equal(compiled_env.get_state(), eager_env.get_state())


def test_step_into_rejects_mismatched_outputs():
    env = nostall.envs.make("CartPole-v1", 4, seed=0)
    env.reset()
    good = env.torch.empty_step()
    bad = good._replace(obs=torch.empty(4, 3))
    with pytest.raises(RuntimeError, match="obs must be Float of shape \\[4, 4\\]"):
        env.torch.step(torch.zeros(4, dtype=torch.long), out=bad)
    bad = good._replace(reward=torch.empty(8, dtype=torch.float64)[::2])
    with pytest.raises(RuntimeError, match="reward must be contiguous"):
        env.torch.step(torch.zeros(4, dtype=torch.long), out=bad)
    env.torch.step(torch.zeros(4, dtype=torch.long), out=good)


RESET_RANGES = {
    # Gymnasium's documented start-state ranges, per exported state component.
    "CartPole-v1": [(-0.05, 0.05)] * 4,
    "Pendulum-v1": [(-np.pi, np.pi), (-1.0, 1.0)],
    "Acrobot-v1": [(-0.1, 0.1)] * 4,
    "MountainCar-v0": [(-0.6, -0.4), (0.0, 0.0)],
    "MountainCarContinuous-v0": [(-0.6, -0.4), (0.0, 0.0), (0.0, 0.0)],
}


@pytest.mark.parametrize("env_id", list(RESET_RANGES))
def test_reset_draws_from_gymnasiums_documented_ranges(env_id):
    env = nostall.envs.make(env_id, 2000, seed=9)
    env.reset()
    state = env.get_state()
    for column, (low, high) in enumerate(RESET_RANGES[env_id]):
        assert state[:, column].min() >= low and state[:, column].max() <= high
        if low < high:  # spread over the range, not stuck in a corner of it
            span = state[:, column].max() - state[:, column].min()
            assert span > 0.95 * (high - low)
    if env_id == "Acrobot-v1":  # Gymnasium stores this start state as float32
        np.testing.assert_array_equal(state, state.astype(np.float32))


def test_state_dict_resumes_exactly_including_generators_and_time_limits():
    env = nostall.envs.make("CartPole-v1", 16, seed=4)
    env.reset()
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, size=16) for _ in range(1200)]
    for a in actions[:300]:
        env.step(a)
    saved = env.state_dict()
    first = [env.step(a) for a in actions[300:]]  # crosses time limits and resets
    other = nostall.envs.make("CartPole-v1", 16, seed=99)  # different seed: all from the dict
    other.load_state_dict(saved)
    second = [other.step(a) for a in actions[300:]]
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a[:4], b[:4], strict=True):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="checkpoint is for CartPole-v1 x 16"):
        nostall.envs.make("CartPole-v1", 8).load_state_dict(saved)
