"""GAE side by side: nostall against every peer in one run, with ratios.

Peers: the pure-PyTorch loop, torch.compile of that loop, TorchRL's generalized_advantage_estimate
and vec_generalized_advantage_estimate, a numpy loop; and a plain C loop over the same data as
the physical limit. At the largest size the op is memory-bound, so it is also set against the
memory roofline: the bytes GAE must move (three float inputs and two bool inputs read, two
float outputs written: 22 bytes an element) over the bandwidth of a one-thread streaming copy
(non-temporal stores) measured in the same run. Each is timed as the median of repeated calls
on the same float32 inputs; results are checked against nostall before timing, so a wrong peer
is never reported as fast.

    python benchmarks/ops/bench_advantages.py [--threads K] [--sizes 128x8,2048x1024]
"""

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

import nostall
from nostall.ops import reference

GAMMA, LMBDA = 0.99, 0.95
SIZES = [(128, 8), (128, 64), (512, 256), (2048, 1024)]
# Compiling the unrolled Python loop grows with T (2 s at T=128, 96 s at T=512 here), so past
# this it is compiled per step instead (one compiled region entered T times).
MAX_UNROLLED_T = 128


def timeit(fn: Callable[[], object], budget_s: float = 0.5, max_reps: int = 200) -> float:
    """Median seconds per call after one warm-up call."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (time.perf_counter() - start < budget_s or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if times[-1] > budget_s:
            break
    return statistics.median(times)


def make_inputs(T: int, N: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(T, N, generator=g) < 0.01
    done = terminated | (torch.rand(T, N, generator=g) < 0.01)
    reward, value, next_value = (torch.randn(T, N, generator=g) for _ in range(3))
    return reward, value, next_value, done, terminated


def load_plain_c() -> Callable:
    src = Path(__file__).with_name("plain_gae.c")
    out = Path(tempfile.mkdtemp()) / "plain_gae.so"
    cmd = ["cc", "-O3", "-march=native", "-shared", "-fPIC", str(src), "-o", str(out)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(out))
    lib.plain_gae.restype = None
    lib.stream_copy.restype = None
    return lib


# Bytes per element GAE cannot avoid moving: reward, value, next_value (float32) and done,
# terminated (bool) read once; advantage and value_target (float32) written once.
GAE_BYTES_PER_ELEMENT = 3 * 4 + 2 * 1 + 2 * 4


def streaming_bandwidth(copy: Callable, n_bytes: int) -> float:
    """Bytes per second moved (read + written) by a one-thread non-temporal copy of n_bytes,
    over buffers far larger than the caches like GAE's inputs."""
    n = n_bytes // 4 // 8 * 8
    # 32-byte aligned views (the aligned loads and streaming stores need it).
    src_raw, dst_raw = torch.rand(n + 8), torch.empty(n + 8)
    src, dst = (x[(-x.data_ptr() // 4) % 8 :][:n] for x in (src_raw, dst_raw))

    def call():
        copy(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), ctypes.c_int64(n))

    seconds = timeit(call, budget_s=1.0)
    assert torch.equal(dst, src)
    return 2 * n * 4 / seconds


def plain_c_gae(fn, reward, value, next_value, done, terminated, adv, target):
    T, N = reward.shape
    p = ctypes.c_void_p
    fn(
        *(p(x.data_ptr()) for x in (reward, value, next_value, done, terminated, adv, target)),
        ctypes.c_int64(T),
        ctypes.c_int64(N),
        ctypes.c_float(GAMMA),
        ctypes.c_float(LMBDA),
    )


def numpy_gae(reward, value, next_value, done, terminated):
    not_term = ~terminated
    delta = reward + GAMMA * not_term * next_value - value
    discount = GAMMA * LMBDA * ~done
    adv = np.empty_like(reward)
    carry = np.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        carry = delta[t] + discount[t] * carry
        adv[t] = carry
    return adv, adv + value


def reference_loop(r, v, nv, d, term):
    return reference.gae(r, v, nv, d, term, GAMMA, LMBDA)


def compiled_peer(T: int) -> tuple[str, Callable]:
    if T <= MAX_UNROLLED_T:
        return "torch.compile(loop)", torch.compile(reference_loop, dynamic=False)

    @torch.compile(dynamic=False)
    def step(delta_t, discount_t, carry):
        return delta_t + discount_t * carry

    def stepwise(r, v, nv, d, term):
        delta = r + GAMMA * (~term).to(r.dtype) * nv - v
        discount = GAMMA * LMBDA * (~d).to(r.dtype)
        adv = torch.empty_like(r)
        carry = torch.zeros_like(r[0])
        for t in reversed(range(r.shape[0])):
            carry = step(delta[t], discount[t], carry)
            adv[t] = carry
        return adv, adv + v

    return "torch.compile(step)", stepwise


def bench_size(T: int, N: int, plain_c) -> list[tuple[str, float]]:
    r, v, nv, d, term = make_inputs(T, N)
    want_adv, _ = nostall.gae(r, v, nv, d, term, GAMMA, LMBDA)
    results = []

    def add(name: str, fn: Callable, check: Callable[[], torch.Tensor]) -> None:
        got = check()
        torch.testing.assert_close(got, want_adv, rtol=1e-4, atol=1e-4, msg=name)
        results.append((name, timeit(fn)))

    ours = lambda: nostall.gae(r, v, nv, d, term, GAMMA, LMBDA)  # noqa: E731
    add("nostall", ours, lambda: ours()[0])
    add(
        "pytorch loop",
        lambda: reference_loop(r, v, nv, d, term),
        lambda: reference_loop(r, v, nv, d, term)[0],
    )
    name, compiled = compiled_peer(T)
    t0 = time.perf_counter()
    compiled_adv = compiled(r, v, nv, d, term)[0]
    compile_s = time.perf_counter() - t0
    add(name, lambda: compiled(r, v, nv, d, term), lambda: compiled_adv)
    # TorchRL takes [*, T, F] with time_dim=-2: our time-major [T, N] is that layout.
    rl = lambda: generalized_advantage_estimate(GAMMA, LMBDA, v, nv, r, d, term)  # noqa: E731
    add("torchrl gae", rl, lambda: rl()[0])
    vec = lambda: vec_generalized_advantage_estimate(GAMMA, LMBDA, v, nv, r, d, term)  # noqa: E731
    add("torchrl vec_gae", vec, lambda: vec()[0])
    rn, vn, nvn, dn, tn = (x.numpy() for x in (r, v, nv, d, term))
    add(
        "numpy loop",
        lambda: numpy_gae(rn, vn, nvn, dn, tn),
        lambda: torch.from_numpy(numpy_gae(rn, vn, nvn, dn, tn)[0]),
    )
    adv, target = torch.empty_like(r), torch.empty_like(r)
    c_call = lambda: plain_c_gae(plain_c.plain_gae, r, v, nv, d, term, adv, target)  # noqa: E731
    add("plain C loop", c_call, lambda: (c_call(), adv)[1])
    print(f"  ({name} compile time: {compile_s:.1f} s, not included)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--sizes", type=str, default=None, help="e.g. 128x8,2048x1024")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = SIZES
    if args.sizes:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    plain_c = load_plain_c()
    print(
        f"GAE float32, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, nostall on {torch.get_num_threads()} thread(s)"
    )
    peers = ("pytorch loop", "torch.compile", "torchrl", "numpy loop")
    for T, N in sizes:
        print(f"\n(T, N) = ({T}, {N})")
        results = bench_size(T, N, plain_c)
        ours = dict(results)["nostall"]
        fastest = min((s, n) for n, s in results if n.startswith(peers))
        for name, sec in results:
            print(f"  {name:22s} {sec * 1e6:12.1f} us   {sec / ours:8.1f}x nostall's time")
        c = dict(results)["plain C loop"]
        print(
            f"  => nostall is {fastest[0] / ours:.1f}x the fastest peer ({fastest[1]}); "
            f"{ours / c:.2f}x the plain C loop's time"
        )
        if (T, N) == max(sizes, key=lambda size: size[0] * size[1]):
            moved = GAE_BYTES_PER_ELEMENT * T * N
            bandwidth = streaming_bandwidth(plain_c.stream_copy, 2 * moved)
            floor = moved / bandwidth
            print(
                f"  one-thread streaming copy: {bandwidth / 1e9:.2f} GB/s; GAE must move "
                f"{moved / 1e6:.0f} MB: roofline {floor * 1e6:.0f} us"
            )
            print(f"  => nostall takes {ours / floor:.2f}x the memory roofline's time")


if __name__ == "__main__":
    main()
