"""The fused pieces of a PPO iteration, side by side with what they replace:

- `nostall.ppo_loss` (forward + backward) against CleanRL's loss op by op, eager and compiled;
- `nostall.ppo_loss_from_log_prob` after a Gaussian policy's log-probabilities against the same
  loss op by op;
- `ClippedAdam.step` against `clip_grad_norm_(foreach=True)` + `Adam(fused=True).step`;
- `nostall::env_rollout` (a chunk of 128 steps x 8 CartPole envs in one call) against the same
  chunk stepped from Python (one policy call and one `env.torch.step` per step).

Every peer's output is checked against nostall's before it is timed. Median microseconds per
call, one torch thread.

    python benchmarks/ops/bench_ppo_step.py
"""

import copy
import platform

import torch
from bench_policy import report, timeit  # the sibling script's timing (run as a script)

import nostall
import nostall.envs
from nostall.algos.ppo.agent import ActorCritic, act, native_rollout
from nostall.envs.layout import slot_layout
from nostall.ops import reference
from nostall.optim import ClippedAdam
from nostall.runtime.rollout import _collect_steps
from nostall.runtime.storage import Chunk


def bench_ppo_loss(m: int, a: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(m, a, generator=g, requires_grad=True)
    value = torch.randn(m, generator=g, requires_grad=True)
    action = torch.randint(0, a, (m,), generator=g)
    old_lp = logits.detach().log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)
    old_lp = old_lp + 0.3 * torch.randn(m, generator=g)
    old_value = value.detach() + 0.3 * torch.randn(m, generator=g)
    adv, target = torch.randn(m, generator=g), torch.randn(m, generator=g)
    targets = (old_lp, old_value, adv, target)

    def ours():
        loss = nostall.ppo_loss(logits, action, value, *targets).loss
        return torch.autograd.grad(loss, (logits, value))

    def eager():
        loss = reference.ppo_loss(logits, action, value, *targets)[0]
        return torch.autograd.grad(loss, (logits, value))

    compiled_loss = torch.compile(reference.ppo_loss)

    def compiled():
        loss = compiled_loss(logits, action, value, *targets)[0]
        return torch.autograd.grad(loss, (logits, value))

    for x, y, z in zip(ours(), eager(), compiled(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(z, y, rtol=1e-5, atol=1e-6)
    rows = {"nostall": timeit(ours), "CleanRL's loss, eager": timeit(eager)}
    rows["CleanRL's loss, torch.compile"] = timeit(compiled)
    report(f"PPO loss, forward + backward, [{m}, {a}] logits", rows)


def bench_gaussian_loss(m: int, a: int) -> None:
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(m, a, generator=g, requires_grad=True)
    log_std = torch.zeros(a, requires_grad=True)
    value = torch.randn(m, generator=g, requires_grad=True)
    action = torch.randn(m, a, generator=g)
    old_lp = -0.5 * (action - mean.detach()).square().sum(-1) + 0.3 * torch.randn(m, generator=g)
    old_value = value.detach() + 0.3 * torch.randn(m, generator=g)
    targets = (old_lp, old_value, torch.randn(m, generator=g), torch.randn(m, generator=g))

    def log_prob_entropy():  # the trainers' Gaussian, written out
        z = (action - mean) / log_std.exp()
        log_prob = (-0.5 * z.pow(2) - log_std - 0.9189385332046727).sum(-1)
        entropy = (0.5 + 0.9189385332046727 + log_std.expand_as(mean)).sum(-1)
        return log_prob, entropy

    def ours():
        loss = nostall.ppo_loss_from_log_prob(*log_prob_entropy(), value, *targets).loss
        return torch.autograd.grad(loss, (mean, log_std, value))

    def eager():
        loss = reference.ppo_loss_from_log_prob(*log_prob_entropy(), value, *targets)[0]
        return torch.autograd.grad(loss, (mean, log_std, value))

    for x, y in zip(ours(), eager(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    rows = {"nostall": timeit(ours), "CleanRL's loss, eager": timeit(eager)}
    report(f"PPO loss of a Gaussian policy, forward + backward, [{m}, {a}] actions", rows)


def bench_optimizer() -> None:
    torch.manual_seed(0)
    ours_net = ActorCritic(4, 2, True, 64)
    peer_net = copy.deepcopy(ours_net)
    lr = torch.tensor(2.5e-3)
    ours_opt = ClippedAdam(ours_net.parameters(), lr=lr, max_grad_norm=0.5, eps=1e-5)
    peer_opt = torch.optim.Adam(peer_net.parameters(), lr=lr.clone(), eps=1e-5, fused=True)
    g = torch.Generator().manual_seed(1)
    for a, b in zip(ours_net.parameters(), peer_net.parameters(), strict=True):
        a.grad = torch.randn(a.shape, generator=g)
        b.grad = a.grad.clone()

    def ours():
        ours_opt.step()

    def peer():
        torch.nn.utils.clip_grad_norm_(peer_net.parameters(), 0.5, foreach=True)
        peer_opt.step()

    for _ in range(3):
        ours()
        peer()
    for a, b in zip(ours_net.parameters(), peer_net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the clip's norm: see optim.py
    rows = {"nostall": timeit(ours), "clip_grad_norm_ + Adam(fused).step": timeit(peer)}
    report("Clip and Adam step, actor-critic 4-64-64-{2,1} (12 tensors)", rows)


def bench_rollout(T: int = 128, N: int = 8) -> None:
    envs = [nostall.envs.make("CartPole-v1", N, seed=0, autoreset_mode="SameStep") for _ in "ab"]
    torch.manual_seed(0)
    agent = ActorCritic.for_env(envs[0], 64)
    layout = slot_layout(envs[0])
    del layout["num_envs"]
    chunks = [Chunk.empty(T, N, **layout) for _ in envs]
    for env, chunk in zip(envs, chunks, strict=True):
        chunk.obs[0].copy_(env.torch.reset(seed=0))
    generators = [torch.Generator().manual_seed(0) for _ in envs]

    def ours():
        native_rollout(agent, envs[0], chunks[0], generators[0])

    @torch.no_grad()
    def stepped():
        _collect_steps(envs[1], lambda obs, g: act(agent, obs, g), chunks[1], generators[1])

    ours()
    stepped()
    for name, t in chunks[0].tensors().items():  # the same chunk, bit for bit
        assert torch.equal(t, chunks[1].tensors()[name]), name
    rows = {"nostall": timeit(ours, 50), "Python step loop (act + env step)": timeit(stepped, 50)}
    report(f"A rollout chunk, {T} steps x {N} CartPole envs, MLP 4-64-64 actor-critic", rows)


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.machine()}, one thread; median us per call\n")
    bench_ppo_loss(256, 2)
    bench_ppo_loss(4096, 18)
    bench_gaussian_loss(256, 1)
    bench_optimizer()
    bench_rollout()


if __name__ == "__main__":
    main()
