"""The sync trap, on a small GRPO-style policy-gradient step.

Two versions of the same update. The trapped one normalises the loss by `mask.sum().item()` and
selects the valid tokens with a boolean mask: each forces the host to wait for the device (a
scalar read, and a `nonzero` inside the mask indexing, forward and backward). The clean one
multiplies by the mask and divides by a device-side count, and never waits.

    python examples/sync_trap.py [--steps 20] [--device cuda]
    nostall profile examples/sync_trap.py -- --variant trapped

SyncWatch finds every sync of the first version and none of the second, on any machine; on a
GPU the end-to-end time per step shows what they cost.
"""

import argparse
import time

import torch

import nostall.profiler as profiler

VOCAB, HIDDEN, GROUP, GROUPS, LENGTH = 64, 128, 4, 8, 32


def make_batch(device: torch.device, generator: torch.Generator):
    """Token sequences of GROUPS prompts x GROUP samples, a padding mask, and rewards."""
    batch = GROUPS * GROUP
    tokens = torch.randint(0, VOCAB, (batch, LENGTH), generator=generator).to(device)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (batch,), generator=generator)
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).float().to(device)
    rewards = torch.rand(batch, generator=generator).to(device)
    return tokens, mask, rewards


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    grouped = rewards.view(GROUPS, GROUP)  # (G, K)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (grouped.std(dim=1, keepdim=True) + 1e-6)).view(-1)  # (B,)


def token_log_probs(policy: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = policy(tokens)  # (B, T, V)
    return logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (B, T)


def trapped_loss(policy, tokens, mask, rewards) -> torch.Tensor:
    advantage = group_advantages(rewards)
    per_token = -token_log_probs(policy, tokens) * advantage[:, None]  # (B, T)
    valid = per_token[mask.bool()]  # boolean-mask indexing: a nonzero, so a sync (and backward)
    return valid.sum() / mask.sum().item()  # .item(): the host waits for the device


def clean_loss(policy, tokens, mask, rewards) -> torch.Tensor:
    advantage = group_advantages(rewards)
    per_token = -token_log_probs(policy, tokens) * advantage[:, None]  # (B, T)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)  # stays on the device


def make_policy(device: torch.device) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, VOCAB)
    ).to(device)


def train(loss_fn, steps: int, device: torch.device) -> float:
    """Runs `steps` updates; returns seconds per step, measured end to end."""
    torch.manual_seed(0)
    policy = make_policy(device)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    with profiler.allow("batches copied to the device once, before the timed loop"):
        batches = [make_batch(device, generator) for _ in range(steps)]
    if device.type == "cuda":
        torch.cuda.synchronize()  # sync: start the clock on an idle device
    start = time.perf_counter()
    for tokens, mask, rewards in batches:
        # On a GPU these live on the device; marked, so a CPU-only run reports as a GPU would.
        profiler.mark(tokens, mask, rewards)
        loss = loss_fn(policy, tokens, mask, rewards)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        profiler.mark_step()
    if device.type == "cuda":
        torch.cuda.synchronize()  # sync: stop the clock once the device is done
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variant", choices=["trapped", "clean", "both"], default="both")
    args = parser.parse_args()
    device = torch.device(args.device)
    variants = {"trapped": trapped_loss, "clean": clean_loss}
    chosen = variants if args.variant == "both" else {args.variant: variants[args.variant]}
    if profiler.active_watch() is not None:  # under `nostall profile`: it reports
        for loss_fn in chosen.values():
            train(loss_fn, args.steps, device)
        return
    for name, loss_fn in chosen.items():
        with profiler.SyncWatch() as watch:
            train(loss_fn, 2, device)
        seconds = train(loss_fn, args.steps, device)
        print(f"\n== {name}: {seconds * 1e3:.3f} ms per step on {device}")
        print(watch.report().table())


if __name__ == "__main__":
    main()
