"""Whole steps under SyncWatch: a clean RL step reports zero syncs; the sync-trap example's
trapped step reports each of its syncs and its clean step none."""

import importlib.util
from pathlib import Path

import torch

import nostall
import nostall.envs
from nostall.profiler import SyncWatch, assert_no_sync

ROOT = Path(__file__).resolve().parents[2]


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_clean_actor_critic_step_on_a_native_env_has_no_sync():
    torch.manual_seed(0)
    env = nostall.envs.make("CartPole-v1", 8, seed=0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    lr = torch.tensor(1e-3)  # a schedule as a tensor: no float() per step
    obs = env.torch.reset()

    def rl_step(obs):
        rows = []
        for _ in range(16):
            out = net(obs)
            logits, value = out[:, :2], out[:, 2]
            noise = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (logits + noise).argmax(-1)  # Gumbel-max: samples without a sync
            log_prob = logits.log_softmax(-1).gather(1, action[:, None])[:, 0]
            step = env.torch.step(action)
            rows.append((log_prob, value, step))
            obs = step.obs
        log_probs, values = (torch.stack([r[i] for r in rows]) for i in (0, 1))
        reward = torch.stack([r[2].reward for r in rows]).float()
        terminated = torch.stack([r[2].terminated for r in rows])
        done = terminated | torch.stack([r[2].truncated for r in rows])
        with torch.no_grad():
            next_value = torch.cat([values[1:], net(obs)[None, :, 2]])
        advantage, target = nostall.gae(
            reward, values.detach(), next_value, done, terminated, 0.99, 0.95
        )
        loss = -(log_probs * advantage).mean() + (values - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        return obs

    obs = rl_step(obs)  # warm-up: optimizer state is created on the first step
    with assert_no_sync(net) as watch:
        for _ in range(3):
            obs = rl_step(obs)
            watch.step()
    assert watch.steps == 3 and watch.report().unintended == []


def test_sync_trap_example_trapped_step_syncs_and_clean_step_does_not():
    trap = _load_example("sync_trap")
    for loss_fn, expected in ((trap.trapped_loss, 3), (trap.clean_loss, 0)):
        with SyncWatch() as watch:
            trap.train(loss_fn, steps=4, device=torch.device("cpu"))
        report = watch.report()
        assert watch.steps == 4
        assert report.unintended_count == expected * 4, report.table()
        if expected:
            assert report.counts_by_kind() == {
                "boolean mask indexing": 4,
                "item": 4,
                "boolean mask assignment": 4,
            }
