"""The policy-side ops of a rollout step and a PPO minibatch, side by side with their peers:

- `nostall.mlp` against the same network as eager `nn.Sequential` and as `torch.compile` of it
  (forward at rollout size; forward + backward at minibatch size);
- `nostall.sample_categorical` against eager Gumbel-max plus log_softmax-gather;
- `nostall::episode_update` against the same statistics in eager torch ops.

Every peer's output is checked against nostall's before it is timed. Median microseconds per
call, one torch thread.

    python benchmarks/ops/bench_policy.py
"""

import platform
import statistics
import time

import torch
from torch import nn

import nostall
from nostall.ops.networks import sequential_layers


def timeit(fn, reps: int = 2000) -> float:
    for _ in range(100):
        fn()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn()
        times.append((time.perf_counter() - t) / (reps // 5))
    return statistics.median(times) * 1e6


def net(obs_dim=4, hidden=64, out=2):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, out),
    )


def report(title: str, rows: dict[str, float]) -> None:
    ours = rows["nostall"]
    width = max(28, *map(len, rows))
    print(title)
    for name, us in rows.items():
        print(f"  {name:{width}s} {us:9.2f} us   {us / ours:5.2f}x nostall's time")


def bench_mlp_forward(m: int) -> None:
    model = net()
    weights, biases, activation = sequential_layers(model)
    x = torch.randn(m, 4)
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(nostall.mlp(x, weights, biases, activation), model(x))
        torch.testing.assert_close(compiled(x), model(x))
        rows = {
            "nostall": timeit(lambda: nostall.mlp(x, weights, biases, activation)),
            "eager nn.Sequential": timeit(lambda: model(x)),
            "torch.compile(nn.Sequential)": timeit(lambda: compiled(x)),
        }
    report(f"MLP 4-64-64-2 tanh, forward, no grad, batch {m}", rows)


def bench_mlp_backward(m: int) -> None:
    model = net()
    weights, biases, activation = sequential_layers(model)
    x = torch.randn(m, 4)
    compiled = torch.compile(model)

    def ours():
        return torch.autograd.grad(nostall.mlp(x, weights, biases, activation).sum(), weights)

    def eager():
        return torch.autograd.grad(model(x).sum(), weights)

    def comp():
        return torch.autograd.grad(compiled(x).sum(), weights)

    for a, b, c in zip(ours(), eager(), comp(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-5)
    rows = {"nostall": timeit(ours, 500), "eager nn.Sequential": timeit(eager, 500)}
    rows["torch.compile(nn.Sequential)"] = timeit(comp, 500)
    report(f"MLP 4-64-64-2 tanh, forward + backward (weight grads), batch {m}", rows)


def bench_sample(n: int, a: int) -> None:
    logits = torch.randn(n, a)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)

    def eager(generator):
        u = torch.rand(logits.shape, generator=generator).clamp_(min=1e-20)
        action = (logits - u.log_().neg_().log_()).argmax(-1)
        return action, logits.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)

    ours_a, ours_lp = nostall.sample_categorical(logits, g1)
    ref_a, ref_lp = eager(g2)
    assert torch.equal(ours_a, ref_a)
    torch.testing.assert_close(ours_lp, ref_lp)
    rows = {
        "nostall": timeit(lambda: nostall.sample_categorical(logits, g1)),
        "eager Gumbel-max + gather": timeit(lambda: eager(g2)),
    }
    report(f"Categorical sample and log-prob, [{n}, {a}] logits (noise drawn inside)", rows)


def bench_episodes(n: int) -> None:
    capacity = 100
    reward = torch.ones(n, dtype=torch.float64)
    done = torch.arange(n) % 3 == 0

    def state():
        f64, i64 = torch.float64, torch.int64
        return [
            torch.zeros(n, dtype=f64),
            torch.zeros(n, dtype=i64),
            torch.zeros(capacity + 1, dtype=f64),
            torch.zeros(capacity + 1, dtype=i64),
            torch.zeros((), dtype=i64),
        ]

    ours, peer = state(), state()
    ours[2], ours[3] = ours[2][:capacity], ours[3][:capacity]

    def eager():  # the tracker's previous form: a scatter into a ring with one spare cell
        run_r, run_l, ring_r, ring_l, finished = peer
        run_r += reward
        run_l += 1
        order = torch.cumsum(done.long(), 0) - 1
        slot = torch.where(done, (finished + order) % capacity, capacity)
        ring_r.scatter_(0, slot, run_r)
        ring_l.scatter_(0, slot, run_l)
        finished += done.sum()
        run_r.masked_fill_(done, 0.0)
        run_l.masked_fill_(done, 0)

    def native():
        torch.ops.nostall.episode_update(reward, done, *ours)

    for _ in range(7):
        eager()
        native()
    torch.testing.assert_close(ours[2], peer[2][:capacity])
    assert torch.equal(ours[4], peer[4])
    rows = {"nostall": timeit(native), "eager torch ops": timeit(eager)}
    report(f"Episode statistics, one step of {n} envs", rows)


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.machine()}, one thread; median us per call\n")
    bench_mlp_forward(8)
    bench_mlp_forward(256)
    bench_mlp_backward(256)
    bench_sample(8, 2)
    bench_sample(1024, 6)
    bench_episodes(8)
    bench_episodes(1024)


if __name__ == "__main__":
    main()
