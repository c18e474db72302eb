"""The cost of the Python autograd registrations (what a torch the native autograd library was
not built for gets) against the native autograd kernels: forward + backward of four ops at
rollout-sized inputs, each side in a process of its own, one torch thread.

    python -m benchmarks.autograd_fallback
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CASES = (
    "gae [128 x 8]",
    "clipped_policy_loss [64 x 5]",
    "token_log_prob_linear [64 x 5 x 64]",
    "mlp 4-64-64-2 [64]",
)


def measure(repeats: int = 2000) -> dict[str, float]:
    import torch

    import nostall

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    reward, value = torch.randn(128, 8, generator=g), torch.randn(128, 8, generator=g)
    done = torch.zeros(128, 8, dtype=torch.bool)
    lp, old = torch.randn(64, 5, generator=g), torch.randn(64, 5, generator=g)
    adv, mask = torch.randn(64, 5, generator=g), torch.ones(64, 5, dtype=torch.bool)
    hidden, weight = torch.randn(64, 5, 64, generator=g), torch.randn(22, 64, generator=g)
    tokens = torch.randint(0, 22, (64, 5), generator=g)
    obs = torch.randn(64, 4, generator=g)
    ws = [
        torch.randn(64, 4, generator=g),
        torch.randn(64, 64, generator=g),
        torch.randn(2, 64, generator=g),
    ]
    bs = [torch.zeros(64), torch.zeros(64), torch.zeros(2)]
    for t in (value, lp, hidden, weight, *ws, *bs):
        t.requires_grad_(True)

    def gae():
        a, v = nostall.gae(reward, value, value, done, done, 0.99, 0.95)
        (a.sum() + v.sum()).backward()

    def policy():
        nostall.clipped_policy_loss(lp, old, adv, mask, 0.2, 0.2, "token_mean", 5).loss.backward()

    def linear():
        nostall.token_log_prob_linear(hidden, weight, tokens).sum().backward()

    def mlp():
        nostall.mlp(obs, ws, bs, "tanh").sum().backward()

    out = {}
    for name, f in zip(CASES, (gae, policy, linear, mlp), strict=True):
        for _ in range(200):
            f()
        start = time.perf_counter()
        for _ in range(repeats):
            f()
        out[name] = 1e6 * (time.perf_counter() - start) / repeats
    out["autograd"] = nostall.AUTOGRAD
    return out


def main() -> None:
    results = {}
    for mode in ("native", "python"):
        env = {**os.environ, "NOSTALL_AUTOGRAD": mode}
        code = "import json, benchmarks.autograd_fallback as b; print(json.dumps(b.measure()))"
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        results[mode] = json.loads(run.stdout.strip().splitlines()[-1])
        assert results[mode]["autograd"] == mode, results[mode]
    print("forward + backward, us per call (one torch thread)")
    print(f"   {'':38} {'native':>8} {'python':>8} {'extra':>8}")
    for name in CASES:
        n, p = results["native"][name], results["python"][name]
        print(f"   {name:38} {n:8.1f} {p:8.1f} {p - n:+8.1f}  ({p / n:.2f}x)")


if __name__ == "__main__":
    main()
