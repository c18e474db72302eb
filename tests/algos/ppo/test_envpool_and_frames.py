"""EnvPool stepped in two halves while the policy acts on the other (send/recv), frame stacking
for Gymnasium image environments, and recording EnvPool episodes."""

import numpy as np
import pytest
import torch
from PIL import Image

from nostall import load_policy
from nostall.algos.ppo.evaluate import record
from nostall.cli import main
from nostall.envs.backends import make_env
from nostall.envs.frame_stack import StackFrames
from nostall.envs.layout import slot_layout
from nostall.runtime.episodes import EpisodeTracker
from nostall.runtime.rollout import collect
from nostall.runtime.storage import rollout_slots
from tests.algos.custom_envs import GraySignEnv, SignEnv, VisualSignEnv

envpool = pytest.importorskip("envpool", reason="EnvPool is not installed")


def _collect_chunk(env, act, num_steps=64):
    chunk = rollout_slots(0, num_steps, **slot_layout(env))[0]
    collect(env, act, chunk, env.torch.reset(), torch.Generator(), EpisodeTracker(env.num_envs))
    return chunk


def _lean_left_act(events):
    """A deterministic policy (push the cart toward the pole's lean), logging each call."""

    def act(obs, generator):
        events.append(("act", len(obs)))
        action = (obs[:, 2] > 0).long()
        zeros = torch.zeros(len(obs))
        return action, action, zeros, zeros

    return act


def test_halves_stepped_in_turn_see_exactly_the_steps_of_one_pool():
    """Two pools of 3 envs stepped while the policy acts on the other half give the chunk one
    pool of 6 gives (same seeds, same actions): observations, rewards, ends, final obs."""
    from nostall.envs.envpool_adapter import EnvPoolVectorEnv

    one_events, halves_events = [], []
    one = EnvPoolVectorEnv("CartPole-v1", 6, seed=3, halves=False)
    halves = EnvPoolVectorEnv("CartPole-v1", 6, seed=3)
    assert halves.torch.groups == [slice(0, 3), slice(3, 6)] and len(one.torch.groups) == 1
    a = _collect_chunk(one, _lean_left_act(one_events))
    b = _collect_chunk(halves, _lean_left_act(halves_events))
    for name in ("obs", "rewards", "terminated", "truncated", "actions"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    done = a.terminated | a.truncated
    assert done.sum() > 3  # episodes ended, and their final observations agree
    assert torch.equal(a.final_obs[done], b.final_obs[done])
    assert one_events == [("act", 6)] * 64 and halves_events == [("act", 3)] * 128
    one.close()
    halves.close()


def test_the_halves_overlap_send_act_recv_in_order():
    """Each half is sent before the policy acts on the other, and received after."""
    from nostall.envs.envpool_adapter import EnvPoolVectorEnv

    env = EnvPoolVectorEnv("CartPole-v1", 4, seed=0)
    events = []
    for name in ("send", "recv"):
        method = getattr(env.torch, name)

        def logged(group, *args, _method=method, _name=name):
            events.append((_name, group))
            return _method(group, *args)

        setattr(env.torch, name, logged)
    _collect_chunk(env, _lean_left_act(events), num_steps=3)
    assert events[:9] == [
        ("act", 2),
        ("send", 0),
        ("act", 2),
        ("send", 1),
        ("recv", 0),
        ("act", 2),
        ("send", 0),
        ("recv", 1),
        ("act", 2),
    ]
    assert events[-1] == ("recv", 1) and events.count(("recv", 0)) == 3
    env.close()


def test_send_and_recv_refuse_to_be_misused():
    from nostall.envs.envpool_adapter import EnvPoolVectorEnv

    env = EnvPoolVectorEnv("CartPole-v1", 4, seed=0)
    env.torch.reset()
    out = env.torch.empty_step()
    with pytest.raises(RuntimeError, match="group 0 has no step in flight"):
        env.torch.recv(0, out.rows(slice(0, 2)))
    env.torch.send(1, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="group 1 already has a step in flight"):
        env.torch.send(1, torch.zeros(2, dtype=torch.int64))
    env.torch.reset()  # a step in flight is received and dropped, not taken for the reset's
    env.torch.step(torch.zeros(4, dtype=torch.int64), out=out)
    env.close()


def test_stacked_frames_along_the_channels():
    env = StackFrames(VisualSignEnv(), 3)
    assert env.observation_space.shape == (40, 40, 9)
    obs, _ = env.reset(seed=0)
    assert np.array_equal(obs[..., :3], obs[..., 6:])  # a reset repeats the first frame
    first = obs[..., 6:].copy()
    for _ in range(4):
        before = obs
        obs, *_ = env.step(0)
        assert np.array_equal(obs[..., :6], before[..., 3:])  # shifted one frame back
        assert np.array_equal(obs[..., 6:], env.unwrapped._frame())  # the newest last
    gray = StackFrames(GraySignEnv(), 4)
    assert gray.observation_space.shape == (4, 40, 40)
    obs, _ = gray.reset(seed=0)
    assert obs.shape == (4, 40, 40) and np.array_equal(obs[0], obs[3])
    assert not np.array_equal(first, 0)
    with pytest.raises(ValueError, match="frame stacking takes uint8 image observations"):
        StackFrames(SignEnv(), 2)


def test_ppo_trains_on_stacked_frames_and_eval_and_record_stack_them_too(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "ppo",
            "--env",
            "tests.algos.custom_envs:GraySignEnv",
            "--frame-stack",
            "2",
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--total-timesteps",
            "128",
            "--no-progress",
            "--no-watch-syncs",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    saved = torch.load(out / "policy.pt", weights_only=True)
    assert saved["frame_stack"] == 2 and saved["obs_shape"] == [2, 40, 40]
    env = "tests.algos.custom_envs:GraySignEnv"  # code: named again, never taken from the file
    assert (
        main(
            ["eval", str(out), "--env", env, "--episodes", "3", "--record", str(tmp_path / "a.gif")]
        )
        == 0
    )
    frames = record(load_policy(out / "policy.pt", env_id=env), tmp_path / "b.gif")
    assert frames == 11  # the reset's frame and ten steps
    with Image.open(tmp_path / "b.gif") as image:
        assert image.size == (40, 40)


@pytest.mark.parametrize(
    "env_id,backend,message",
    [
        ("CartPole-v1", "native", "frame_stack applies to image observations"),
        ("tests.algos.custom_envs:SignEnv", "gymnasium", "frame stacking takes uint8 image"),
        ("CartPole-v1", "envpool", "cannot be made with {'stack_num': 2}"),
    ],
)
def test_frame_stacking_refuses_what_it_cannot_stack(env_id, backend, message):
    with pytest.raises(ValueError, match=message):
        make_env(env_id, 2, backend=backend, frame_stack=2)


def test_envpool_frame_stack_is_its_stack_num():
    env = make_env("Pong-v5", 2, backend="envpool", frame_stack=2)
    assert env.single_observation_space.shape == (2, 84, 84)
    assert env.torch.reset().shape == (2, 2 * 84 * 84)
    env.close()


def test_an_envpool_run_is_evaluated_and_recorded(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "ppo",
            "--env",
            "CartPole-v1",
            "--env-backend",
            "envpool",
            "--num-envs",
            "4",
            "--num-steps",
            "32",
            "--total-timesteps",
            "256",
            "--no-progress",
            "--no-watch-syncs",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    gif = tmp_path / "episode.gif"
    assert main(["eval", str(out), "--episodes", "2", "--record", str(gif)]) == 0
    assert 5 < record(load_policy(out / "policy.pt"), gif) < 501
    with Image.open(gif) as image:
        assert image.size == (600, 400)
