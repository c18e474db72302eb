"""episode_update: the ring of finished episodes against a plain Python loop, opcheck, compile,
errors, and hypothesis-drawn step sequences."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nostall.ops  # noqa: F401  (registers the fake kernels)
from nostall.runtime.episodes import EpisodeTracker

ops = torch.ops.nostall


def python_tracker(rewards, dones, capacity):
    """The same statistics with Python numbers: (returns ring, lengths ring, finished)."""
    n = len(rewards[0])
    run_r, run_l = [0.0] * n, [0] * n
    ring_r, ring_l, finished = [0.0] * capacity, [0] * capacity, 0
    for reward, done in zip(rewards, dones, strict=True):
        for e in range(n):
            run_r[e] += reward[e]
            run_l[e] += 1
            if done[e]:
                ring_r[finished % capacity], ring_l[finished % capacity] = run_r[e], run_l[e]
                run_r[e], run_l[e] = 0.0, 0
                finished += 1
    return ring_r, ring_l, finished, run_r, run_l


def state(n, capacity):
    return (
        torch.zeros(n, dtype=torch.float64),
        torch.zeros(n, dtype=torch.int64),
        torch.zeros(capacity, dtype=torch.float64),
        torch.zeros(capacity, dtype=torch.int64),
        torch.zeros((), dtype=torch.int64),
    )


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 9),
    steps=st.integers(1, 40),
    capacity=st.integers(1, 12),
    p_done=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_matches_python_loop(n, steps, capacity, p_done, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(steps, n, generator=g, dtype=torch.float64)
    dones = torch.rand(steps, n, generator=g) < p_done
    step_by_step, whole_chunk = state(n, capacity), state(n, capacity)
    for t in range(steps):
        ops.episode_update(rewards[t], dones[t], *step_by_step)
    ops.episode_update(rewards, dones, *whole_chunk)  # [T, N]: the same steps in one call
    ring_r, ring_l, finished, run_r, run_l = python_tracker(
        rewards.tolist(), dones.tolist(), capacity
    )
    for s in (step_by_step, whole_chunk):
        assert int(s[4]) == finished
        torch.testing.assert_close(s[2], torch.tensor(ring_r, dtype=torch.float64))
        assert s[3].tolist() == ring_l
        torch.testing.assert_close(s[0], torch.tensor(run_r, dtype=torch.float64))
        assert s[1].tolist() == run_l


def test_tracker_recent_means():
    tracker = EpisodeTracker(2, capacity=3)
    done = torch.tensor([True, False])
    for r in (1.0, 2.0, 3.0, 4.0):
        tracker.update(torch.tensor([r, 10.0], dtype=torch.float64), done)
    finished, mean_return, mean_length = tracker.recent(2)
    assert (finished, mean_return, mean_length) == (4, 3.5, 1.0)


def test_strided_rows_of_a_rollout_buffer():
    rewards = torch.arange(12, dtype=torch.float64).view(4, 3).t()  # each row has stride 3
    dones = torch.ones(4, 3, dtype=torch.bool).t()
    s = state(4, 8)
    ops.episode_update(rewards[0], dones[0], *s)
    assert s[2][:4].tolist() == [0.0, 3.0, 6.0, 9.0]
    s = state(4, 16)
    ops.episode_update(rewards, dones, *s)  # [T, N] with strides (1, 3)
    assert s[2][:12].tolist() == [0.0, 3.0, 6.0, 9.0, 1.0, 4.0, 7.0, 10.0, 2, 5, 8, 11]


def test_opcheck_and_compile():
    reward = torch.randn(3, dtype=torch.float64)
    done = torch.tensor([True, False, True])
    torch.library.opcheck(ops.episode_update.default, (reward, done, *state(3, 4)))
    s_eager, s_compiled = state(3, 4), state(3, 4)

    def two_steps(s):
        ops.episode_update(reward, done, *s)
        ops.episode_update(reward, ~done, *s)

    two_steps(s_eager)
    torch._dynamo.reset()
    torch.compile(two_steps, fullgraph=True)(s_compiled)
    for a, b in zip(s_eager, s_compiled, strict=True):
        torch.testing.assert_close(a, b)


def _bad_cases():
    reward = torch.zeros(3, dtype=torch.float64)
    done = torch.zeros(3, dtype=torch.bool)
    rr, rl, ring_r, ring_l, fin = state(3, 4)
    return [
        ((reward.float(), done, rr, rl, ring_r, ring_l, fin), r"reward must be a float64 \[N\]"),
        ((reward, done[:2], rr, rl, ring_r, ring_l, fin), "done must be a bool tensor of reward"),
        ((reward, done.long(), rr, rl, ring_r, ring_l, fin), "done must be a bool tensor"),
        (
            (reward, done, rr[:2], rl, ring_r, ring_l, fin),
            "running_return must be a float64 \\[3\\]",
        ),
        (
            (reward, done, rr, rl.int(), ring_r, ring_l, fin),
            "running_length must be an int64 \\[3\\]",
        ),
        ((reward, done, rr, rl, ring_r[:0], ring_l[:0], fin), "returns must be a float64 \\[C\\]"),
        ((reward, done, rr, rl, ring_r, ring_l[:2], fin), "lengths must be an int64 \\[4\\]"),
        ((reward, done, rr, rl, ring_r, ring_l, fin[None]), "finished must be an int64 scalar"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_arguments(case):
    args, message = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=message):
        ops.episode_update(*args)
    with pytest.raises(RuntimeError, match=message), torch._subclasses.FakeTensorMode() as mode:
        ops.episode_update(*[mode.from_tensor(a) for a in args])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_cuda_matches_cpu_without_sync():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(30, 5, generator=g, dtype=torch.float64)
    dones = torch.rand(30, 5, generator=g) < 0.3
    cpu, gpu = state(5, 7), [t.cuda() for t in state(5, 7)]
    gpu_chunk = [t.cuda() for t in state(5, 7)]
    rewards_gpu, dones_gpu = rewards.cuda(), dones.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(30):
            ops.episode_update(rewards_gpu[t], dones_gpu[t], *gpu)
        ops.episode_update(rewards_gpu, dones_gpu, *gpu_chunk)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for t in range(30):
        ops.episode_update(rewards[t], dones[t], *cpu)
    for a, b, c in zip(cpu, gpu, gpu_chunk, strict=True):
        torch.testing.assert_close(b.cpu(), a)
        torch.testing.assert_close(c.cpu(), a)
