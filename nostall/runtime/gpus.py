"""Which GPU each process of a Ray run holds, so that no two NCCL ranks share one.

The driver picks its GPU itself (the run's `--device`); Ray assigns its actors theirs, from
the GPUs its node was started with, and knows nothing of the driver's. Two processes on one
GPU are fine for the object store, but NCCL refuses them ("Duplicate GPU detected"). So a
local cluster that the run starts for NCCL peers of the driver (FSDP2 trainer ranks, a weight
broadcast) is started with the driver's GPU hidden from it, and the ranks' GPUs are compared
by UUID before they join, which also finds a collision on a cluster the run joined. Whether
the cluster holds the actors' CPUs and GPUs at all is checked before any is started."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus() -> list[str]:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""
    listed = os.environ.get(VISIBLE)
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def physical_gpu(device: torch.device) -> str | None:
    """`device`'s name in CUDA_VISIBLE_DEVICES' terms (what Ray assigns by); None off a GPU."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = visible_gpus()
    if index >= len(visible):
        raise ValueError(f"{device} is not among this process's GPUs ({VISIBLE}={visible})")
    return visible[index]


@contextlib.contextmanager
def hidden_from_ray(gpu: str | None) -> Iterator[None]:
    """While a local Ray cluster starts inside it: CUDA_VISIBLE_DEVICES without `gpu`, which
    the cluster's processes inherit, so no actor is assigned it. This process's own CUDA is
    not touched (it read the variable when it started, or reads the restored one)."""
    if gpu is None:
        yield
        return
    before = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = ",".join(name for name in visible_gpus() if name != gpu)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = before


def gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID: the same GPU's in every process and on every machine."""
    return str(torch.cuda.get_device_properties(device).uuid)


def check_distinct(uuids: list[str]) -> None:
    """Raises naming the first two of `uuids` (one a process, by rank) that are one GPU."""
    first: dict[str, int] = {}
    for rank, uuid in enumerate(uuids):
        if uuid in first:
            raise RuntimeError(
                f"ranks {first[uuid]} and {rank} are on one GPU ({uuid}): NCCL needs a GPU a "
                "rank. Give the Ray cluster a GPU for each besides the driver's (a cluster the "
                "run starts itself leaves the driver's out)"
            )
        first[uuid] = rank


def check_fits(
    have: dict[str, float], each: dict[str, float], count: int, what: str, where: str = ""
) -> None:
    """Raises naming the shortfall where `count` actors (`what`, counted) of `each`'s resources
    ({"num_cpus", "num_gpus"}) need more CPUs or GPUs than `have` (Ray's names) holds: before
    any starts, not a placement Ray waits on for ever. `where` qualifies the cluster's count."""
    for kind, resource in (("CPUs", "CPU"), ("GPUs", "GPU")):
        per_actor = each[f"num_{resource.lower()}s"]
        need, held = per_actor * count, have.get(resource, 0.0)
        if need > held:
            raise ValueError(
                f"{what} x {per_actor:g} {kind} need {need:g} {kind}; "
                f"the Ray cluster has {held:g}{where}"
            )
