"""The policy-gradient loss ops side by side: nostall, the pure-PyTorch reference and
torch.compile of the reference, in one run, with ratios.

Each case runs in two fresh worker processes, each building the inputs and warming the
implementation up (compiling it, for the compiled reference) on the same shapes:

- time: median forward + backward seconds over repeated calls, with the default allocator;
- peak memory, in the other process: the largest resident size during one forward + backward
  above the resident size just before it (inputs excluded), read from Linux's per-process
  high-water mark (VmHWM), reset before the call. There glibc gets a fixed mmap threshold, so
  every large tensor is mapped on its own and returned when freed and the resident size
  follows the live tensors (the page faults this costs are why timing runs apart).

Every implementation's output is checked against nostall's after measuring, so a wrong peer is
never reported.

    python benchmarks/ops/bench_losses.py [--quick] [--threads K] [--only linear]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

IMPLS = ("nostall", "reference", "compiled")

# (op, B, T, V or None, H or None, dtype): token_log_prob at the shapes, its linear
# variant (H kept small so the CPU's matrix products stay affordable: the memory question is
# about the [B, T, V] logits, which H does not change), and the loss at typical GRPO shapes.
CASES = [
    ("token_log_prob", 8, 256, 32000, None, "float32"),
    ("token_log_prob", 8, 256, 32000, None, "bfloat16"),
    ("token_log_prob", 4, 1024, 32000, None, "float32"),
    ("token_log_prob", 4, 1024, 32000, None, "bfloat16"),
    ("token_log_prob_linear", 8, 256, 32000, 128, "float32"),
    ("token_log_prob_linear", 8, 256, 32000, 128, "bfloat16"),
    ("clipped_policy_loss", 64, 1024, None, None, "float32"),
    ("clipped_policy_loss", 256, 2048, None, None, "float32"),
    ("group_advantages", 1024, 8, None, None, "float32"),
]
QUICK_CASES = [
    ("token_log_prob", 2, 128, 8192, None, "float32"),
    ("token_log_prob_linear", 2, 128, 8192, 64, "float32"),
    ("clipped_policy_loss", 16, 256, None, None, "float32"),
    ("group_advantages", 64, 8, None, None, "float32"),
]


def make_case(op, B, T, V, H, dtype):
    """(inputs requiring grad, other inputs, {impl: fn(*grad_inputs) -> output})."""
    import nostall
    from nostall.ops import reference

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    if op == "token_log_prob":
        logits = (torch.randn(B, T, V, generator=g) * 2).to(dt)
        tokens = torch.randint(0, V, (B, T), generator=g)
        fns = {
            "nostall": lambda x: nostall.token_log_prob(x, tokens),
            "reference": lambda x: reference.token_log_prob(x, tokens),
        }
        return [logits], fns
    if op == "token_log_prob_linear":
        hidden = torch.randn(B, T, H, generator=g).to(dt)
        weight = (torch.randn(V, H, generator=g) / H**0.5).to(dt)
        tokens = torch.randint(0, V, (B, T), generator=g)
        fns = {
            "nostall": lambda h, w: nostall.token_log_prob_linear(h, w, tokens),
            "reference": lambda h, w: reference.token_log_prob_linear(h, w, tokens),
        }
        return [hidden, weight], fns
    if op == "clipped_policy_loss":
        log_prob = -torch.rand(B, T, generator=g) * 3
        old = log_prob + 0.2 * torch.randn(B, T, generator=g)
        adv = torch.randn(B, generator=g)
        mask = torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)
        args = (old, adv, mask, 0.2, 0.28, "seq_mean_token_mean", T)
        fns = {
            "nostall": lambda x: nostall.clipped_policy_loss(x, *args).loss,
            "reference": lambda x: reference.clipped_policy_loss(x, *args)[0],
        }
        return [log_prob], fns
    if op == "group_advantages":
        reward = torch.randn(B * T, generator=g)
        index = torch.arange(B).repeat_interleave(T)
        fns = {
            "nostall": lambda r: nostall.group_advantages(r, index, B),
            "reference": lambda r: reference.group_advantages(r, index, B),
        }
        return [reward], fns
    raise ValueError(op)


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _median_seconds(fn) -> float:
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < 2.0 and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(spec):
    """Measures one (case, impl) in this process; prints a JSON line."""
    op, B, T, V, H, dtype, impl, threads, measure = spec
    torch.set_num_threads(threads)
    inputs, fns = make_case(op, B, T, V, H, dtype)
    if impl == "product":  # the linear variant's unit of work: one [B*T, H] x [H, V] product
        hidden, weight = inputs
        rows = hidden.reshape(-1, H)
        print(json.dumps({"seconds": _median_seconds(lambda: torch.mm(rows, weight.t()))}))
        return
    fn = fns["reference"] if impl == "compiled" else fns[impl]
    if impl == "compiled":
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    leaves = [x.clone().requires_grad_() for x in inputs]

    def step():
        for x in leaves:
            x.grad = None
        out = fn(*leaves)
        out.sum().backward()
        return out

    step()  # warm-up (and compilation) on these very shapes
    result = {}
    if measure == "memory":
        for x in leaves:
            x.grad = None  # the warm-up's gradients must not be counted as already resident
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := current resident size
        before = _status_kib("VmRSS")
        step()
        result["peak_mib"] = (_status_kib("VmHWM") - before) / 1024
    else:
        result["seconds"] = _median_seconds(step)

    # Check against nostall after measuring (the check's tensors must not count).
    out = step().detach().double()
    grads = [x.grad.double() for x in leaves]
    ref_leaves = [x.clone().requires_grad_() for x in inputs]
    ref_out = fns["nostall"](*ref_leaves)
    ref_out.sum().backward()
    loose = dtype == "bfloat16"
    tol = dict(rtol=2e-2, atol=2e-2) if loose else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref_out.detach().double(), **tol)
    for a, b in zip(grads, ref_leaves, strict=True):
        torch.testing.assert_close(a, b.grad.double(), **tol)
    print(json.dumps(result))


def _worker_run(case, impl, threads, measure):
    env = dict(os.environ)
    if measure == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps([*case, impl, threads, measure])],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{case} {impl} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_worker(case, impl, threads):
    return {
        **_worker_run(case, impl, threads, "time"),
        **_worker_run(case, impl, threads, "memory"),
    }


def shape_of(case):
    op, B, T, V, H, dtype = case
    dims = [f"B={B}", f"T={T}"] + ([f"V={V}"] if V else []) + ([f"H={H}"] if H else [])
    if op == "group_advantages":
        dims = [f"{B} groups of {T}"]
    return " ".join(dims) + f" {dtype}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", help="cases whose op and shape contain this, e.g. 'linear'")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if not os.path.exists("/proc/self/clear_refs"):
        sys.exit("bench_losses.py reads Linux's /proc peak resident size; not available here")

    cases = QUICK_CASES if args.quick else CASES
    if args.only:
        cases = [c for c in cases if args.only in f"{c[0]} {shape_of(c)}"]
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} threads; forward + backward per call, peak = extra resident memory"
    )
    header = (
        f"{'op':22} {'shape':32} {'impl':10} {'ms':>9} {'peak MiB':>9} {'time x':>7} {'mem %':>6}"
    )
    print(header)
    print("-" * len(header))
    for case in cases:
        results = {impl: run_worker(case, impl, args.threads) for impl in IMPLS}
        ours = results["nostall"]
        for impl in IMPLS:
            r = results[impl]
            speed = r["seconds"] / ours["seconds"]  # peer time / ours: > 1 means we are faster
            mem = 100 * ours["peak_mib"] / max(r["peak_mib"], 1e-9)
            ratio = "" if impl == "nostall" else f"{speed:6.2f}x {mem:5.0f}%"
            print(
                f"{case[0]:22} {shape_of(case):32} {impl:10} {r['seconds'] * 1e3:9.2f} "
                f"{r['peak_mib']:9.1f} {ratio}"
            )
        if case[0] == "token_log_prob_linear":
            product = _worker_run(case, "product", args.threads, "time")["seconds"]
            # Holding no [B, T, V] tensor, the backward recomputes the logits: 4 products' work
            # (forward 1; backward: logits, grad_hidden, grad_weight), in row chunks, against
            # the 3 of an implementation that keeps them (compiled or not), in one product each.
            print(
                f"{'':22} {'':32} one whole [B*T, H] x [H, V] product: {product * 1e3:.0f} ms; "
                f"nostall does 4 products' work in {ours['seconds'] / product:.2f}x that, the "
                f"compiled reference 3 in {results['compiled']['seconds'] / product:.2f}x"
            )
        print()
    print(
        "time x: the peer's time over nostall's (above 1: nostall is faster); mem %: nostall's "
        "peak as a share of the peer's"
    )


if __name__ == "__main__":
    main()
