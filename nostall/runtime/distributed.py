"""Data-parallel trainer ranks: `--trainers M` splits each minibatch over M ranks joined by
torch.distributed (gloo on CPUs, NCCL on GPUs) that average their gradients before every
optimizer step, so a large model's update scales with the rollout.

The driver is rank 0 and keeps the whole trainer loop (the runtime, logging, checkpoints);
ranks 1..M-1 are Ray actors on the run's cluster, each with a copy of the agent and the
optimizer made from rank 0's state. Each iteration the driver puts the chunk in the object
store once, every rank computes the same targets from it and runs the same epochs with the
same permutation (the same generator), each on its contiguous 1/M of every minibatch; the
optimizer averages the flat gradient over the ranks (one all-reduce a step, ClippedAdam's
`reduce_grad`) before clipping, so every rank takes the same step and the weights stay equal
without being sent. With mean losses and equal shards the averaged gradient is the gradient of
the whole minibatch (tested); per-minibatch advantage normalisation (norm_adv) is then taken
per shard, as data-parallel PPO implementations do.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

# How long ranks wait for each other to join, and for a collective, before failing.
JOIN_TIMEOUT_S = 60.0


def open_store(host: str, world: int) -> dist.TCPStore:
    """Rank 0's TCPStore, listening on `host` (the address the cluster gives this node) at a
    port the OS picks as it binds: no other process can take the port between its choice and
    its use, as it could one found free and let go (a retry would only narrow that window).
    Its port is `store.port`. Like every torch.distributed store it has no authentication: the
    cluster's network must be trusted (docs/scaling.md)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.bind((host, 0))
        listener.listen()
        port = listener.getsockname()[1]
    except OSError as e:
        listener.close()
        raise RuntimeError(
            f"cannot listen on {host} (this node's cluster address) for the process group: {e}"
        ) from e
    return dist.TCPStore(
        host,
        port,
        world,
        True,
        datetime.timedelta(seconds=JOIN_TIMEOUT_S),
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )


def join(
    address: str, rank: int, world: int, backend: str = "gloo", store: dist.TCPStore | None = None
) -> None:
    """Joins the trainers' process group: rank 0 through its `open_store`, the others through
    its address (tcp://host:port; a rank 0 given only the address listens there itself)."""
    timeout = datetime.timedelta(seconds=JOIN_TIMEOUT_S)
    if store is None:
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        store = dist.TCPStore(host, int(port), world, rank == 0, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def average_gradients(flat_grad: torch.Tensor) -> None:
    """The mean of every rank's gradient, in place (one all-reduce over the flat buffer)."""
    dist.all_reduce(flat_grad)
    flat_grad.div_(dist.get_world_size())


class _Rank:
    """Trainer rank r > 0 (a Ray actor): the agent, the optimizer, the generator of rank 0,
    and the update of its shard."""

    def __init__(self, build: Callable, state: dict, rank: int, world: int, address: str):
        torch.set_num_threads(1)
        self.agent, self.optimizer, self.lr, self.generator, self.update_fn = build(state)
        self.rank, self.world = rank, world
        self.address = address

    def join(self) -> int:
        join(self.address, self.rank, self.world)
        self.optimizer.reduce_grad = average_gradients
        return self.rank

    def update(self, arrays: dict, version: int, lr: float) -> None:
        chunk = self.update_fn.empty_chunk()
        for name, tensor in chunk.tensors().items():
            np.copyto(tensor.numpy(), arrays[name])  # sync: none, host tensors
        chunk.version = version
        self.lr.fill_(lr)
        self.update_fn(self.agent, self.optimizer, chunk, self.generator, (self.rank, self.world))

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.agent.state_dict().items()}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class TrainerRanks:
    """Ranks 1..M-1 for a driver that is rank 0. `build(state)` makes (agent, optimizer, lr,
    generator, update_fn) from rank 0's `state` in the rank's process; `update_fn(agent,
    optimizer, chunk, generator, (rank, world))` is one iteration's update."""

    def __init__(self, world: int, build: Callable, state: dict, optimizer, cpus: float = 1.0):
        import ray

        if world < 2:
            raise ValueError(f"TrainerRanks needs at least 2 ranks, got {world}")
        self.ray, self.world = ray, world
        host = ray.util.get_node_ip_address()
        store = open_store(host, world)
        address = f"tcp://{host}:{store.port}"
        rank_class = ray.remote(_Rank).options(num_cpus=cpus, max_restarts=0)
        self.ranks = [rank_class.remote(build, state, r, world, address) for r in range(1, world)]
        joined = [rank.join.remote() for rank in self.ranks]
        join(address, 0, world, store=store)  # returns once every rank has joined
        ray.get(joined, timeout=JOIN_TIMEOUT_S)
        optimizer.reduce_grad = average_gradients
        self._optimizer = optimizer
        self._pending: list = []

    def dispatch(self, chunk, lr: float) -> None:
        """Starts ranks 1..M-1 on `chunk` (put in the object store once); rank 0, the caller,
        runs its own shard next and `wait`s."""
        arrays = {k: v.numpy() for k, v in chunk.tensors().items()}  # sync: none, host chunk
        ref = self.ray.put(arrays)
        self._pending = [rank.update.remote(ref, chunk.version, lr) for rank in self.ranks]

    def wait(self) -> None:
        """Raises with the cause if a rank failed."""
        pending, self._pending = self._pending, []
        try:
            self.ray.get(pending, timeout=JOIN_TIMEOUT_S)
        except Exception as e:
            raise RuntimeError(f"a trainer rank failed: {e}") from e

    def weights(self, rank: int) -> dict:
        return self.ray.get(self.ranks[rank - 1].weights.remote())

    def close(self) -> None:
        self._optimizer.reduce_grad = None
        for rank in self.ranks:
            with contextlib.suppress(Exception):
                self.ray.kill(rank)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
