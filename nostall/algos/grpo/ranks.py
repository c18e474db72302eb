"""GRPO's `--trainers M`: rank 0 in the driver, beside the run's loop, and ranks 1..M-1 as Ray
actors on the run's cluster, each a ShardedTrainer (sharded.py) joined by torch.distributed
(gloo on CPUs, NCCL on GPUs).

Every update the driver puts the batch in the object store once; every rank runs GRPO's
update on its share of each micro-batch, FSDP averaging the gradients, then all of them gather
the new weights whole, which rank 0 writes into the driver's model: the one the loop publishes
to generation, the checkpoints save and `save_pretrained` writes, so everything outside the
update is the single-rank run's. Before a checkpoint the optimizer's sharded state is gathered
the same way into the driver's ClippedAdam, whose state_dict the checkpoint holds: a run
resumes at any M (one included), and the ranks start from that optimizer's state."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist

from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.sharded import MOMENTS, RankUpdate, ShardedTrainer
from nostall.lm.batch import LMBatch
from nostall.optim import ClippedAdam
from nostall.runtime import distributed
from nostall.runtime.gpus import check_distinct, check_fits, gpu_uuid


def _whole_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` on the host whose parameters own their storage (the driver's are
    views of the optimizer's flat buffer)."""
    copied = copy.deepcopy(model).cpu()  # sync: once, at start, the ranks' starting weights
    with torch.no_grad():
        for param in copied.parameters():
            param.data = param.data.clone()
    return copied


class _Rank:
    """Trainer rank r > 0 (a Ray actor; on GPUs it sees the one Ray assigned it)."""

    def __init__(self, args: GRPOConfig, start: dict, rank: int, world: int, address: str):
        torch.set_num_threads(args.torch_threads)
        self.args, self.start, self.rank, self.world = args, start, rank, world
        self.address = address
        self.device = torch.device("cuda" if start["backend"] == "nccl" else "cpu")
        self.trainer: ShardedTrainer | None = None

    def gpu(self) -> str:
        return gpu_uuid(self.device)

    def join(self) -> int:
        distributed.join(self.address, self.rank, self.world, self.start["backend"])
        self.trainer = _trainer(self.args, self.start, self.rank, self.world, self.device)
        self.start = None
        return self.rank

    def update(self, tensors: dict, lr: float, measure: bool) -> None:
        batch = LMBatch(**{k: v.to(self.device) for k, v in tensors.items()})
        self.trainer.update(batch, lr, measure)
        self.trainer.full_weights()  # (the gather rank 0 keeps)

    def optimizer_state(self) -> None:
        self.trainer.full_optimizer_state()  # (the gather rank 0 keeps)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _trainer(
    args: GRPOConfig, start: dict, rank: int, world: int, device: torch.device
) -> ShardedTrainer:
    trainer = ShardedTrainer(
        start["model"].to(device),
        args,
        rank,
        world,
        start["update"].to(device),
        device,
        start["reference"],
    )
    trainer.load_optimizer_state(start["optimizer"])
    return trainer


class GRPORanks:
    """The M ranks of a run (M >= 2), started inside the run's loop (Ray up) by `with`."""

    def __init__(
        self,
        args: GRPOConfig,
        model: torch.nn.Module,
        compute: torch.nn.Module,
        optimizer: ClippedAdam,
        update: RankUpdate,
        reference: torch.nn.Module | None = None,
    ):
        """`reference`: --beta's reference model (the driver's, whole), sharded on the ranks."""
        if args.trainers < 2:
            raise ValueError(f"GRPORanks needs at least 2 ranks, got {args.trainers}")
        self.args, self.world = args, args.trainers
        self.model, self.compute, self.optimizer = model, compute, optimizer
        self.reference = reference  # (a resumed run's is loaded before the ranks start)
        self.device = next(compute.parameters()).device  # rank 0's: the driver's
        self.on_gpu = self.device.type == "cuda"
        self._backend = "nccl" if self.on_gpu else "gloo"
        self._update = update
        names = {id(p): name for name, p in model.named_parameters()}
        self.names = [names[id(p)] for p in optimizer.parameters_in_order]
        # Where each update's gathered weights go: the model and, with bf16 compute, its copy.
        self._targets = [
            dict(m.named_parameters()) for m in ((model,) if compute is model else (model, compute))
        ]
        self.ray = None
        self.ranks: list = []
        self.local: ShardedTrainer | None = None

    # -- lifetime ------------------------------------------------------------------------------
    def _start_state(self) -> dict:
        """What every rank starts from: the driver's model, its optimizer's state (a resumed
        run's), the reference model (--beta), the sampler's vocabulary, the run's dtype and
        behaviour correction."""
        update = self._update.to(torch.device("cpu"))  # sync: once, at start (the vocabulary)
        reference = None if self.reference is None else _whole_copy(self.reference)
        return {
            "backend": self._backend,
            "model": _whole_copy(self.model),
            "update": update,
            "optimizer": self._optimizer_state(),
            "reference": reference,
        }

    def _optimizer_state(self) -> dict:
        saved = self.optimizer.state_dict()["state"]
        state = {}
        for index, name in enumerate(self.names):
            entry = saved.get(index)
            # (Only an optimizer that has stepped, a resumed run's, has state to hand on.)
            if entry and float(entry["step"]) > 0:  # sync: once, at start
                state[name] = {k: entry[k].cpu() for k in ("step", *MOMENTS)}  # sync: once
        return state

    def __enter__(self) -> GRPORanks:
        import ray  # (the loop's start brought Ray up)

        self.ray = ray
        resources = {"num_cpus": float(self.args.torch_threads), "num_gpus": float(self.on_gpu)}
        # (Free now that the workers have theirs; the driver's GPU is not the cluster's.)
        besides = " and the driver's GPU" if self.on_gpu else ""
        check_fits(
            ray.available_resources(),
            resources,
            self.world - 1,
            f"--trainers {self.world}: ranks 1..{self.world - 1}",
            f" free besides the generation workers'{besides}",
        )
        host = ray.util.get_node_ip_address()
        store = distributed.open_store(host, self.world)
        address = f"tcp://{host}:{store.port}"
        start = self._start_state()
        start_ref = ray.put(start)
        rank_class = ray.remote(_Rank).options(max_restarts=0, **resources)
        self.ranks = [
            rank_class.remote(self.args, start_ref, r, self.world, address)
            for r in range(1, self.world)
        ]
        joined = []
        try:
            if self.on_gpu:  # one GPU a rank, or NCCL's first collective fails obscurely
                uuids = ray.get(
                    [rank.gpu.remote() for rank in self.ranks], timeout=distributed.JOIN_TIMEOUT_S
                )
                check_distinct([gpu_uuid(self.device), *uuids])
            joined = [rank.join.remote() for rank in self.ranks]
            distributed.join(address, 0, self.world, start["backend"], store)  # once all joined
            self.local = _trainer(self.args, start, 0, self.world, self.device)
            ray.get(joined, timeout=distributed.JOIN_TIMEOUT_S)
        except BaseException as e:
            self.close()
            raise RuntimeError(
                f"--trainers {self.world}: the ranks did not start ({self._cause(joined, e)})"
            ) from e
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for rank in self.ranks:
            with contextlib.suppress(Exception):
                self.ray.kill(rank)
        self.ranks = []
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        self.local = None

    # -- the update ----------------------------------------------------------------------------
    def update(self, batch: LMBatch, lr: float, measure: bool = True) -> dict[str, torch.Tensor]:
        """GRPO's update of the driver's model on `batch` by the M ranks; its metrics (TRL's
        further figures with `measure`, on every rank alike: their reductions are collective)."""
        # The ranks take the batch from the store, on the host: a rank's GPU is not the driver's.
        tensors = batch.tensors()
        if self.on_gpu:
            tensors = {k: v.cpu() for k, v in tensors.items()}  # sync: the batch, once an update
        ref = self.ray.put(tensors)
        pending = [rank.update.remote(ref, lr, measure) for rank in self.ranks]
        try:
            metrics = self.local.update(batch, lr, measure)
            whole = self.local.full_weights()
        except BaseException as e:
            raise RuntimeError(f"a trainer rank failed: {self._cause(pending, e)}") from e
        with torch.no_grad():  # the whole weights into the model generation and saving read
            for params in self._targets:
                for name, value in whole.items():  # (the trained ones: LoRA's adapters alone)
                    params[name].copy_(value)
        self._wait(pending)
        return metrics

    def sync_optimizer(self) -> None:
        """The ranks' optimizer state, whole, into the driver's optimizer (for a checkpoint)."""
        pending = [rank.optimizer_state.remote() for rank in self.ranks]
        try:
            state = self.local.full_optimizer_state()
        except BaseException as e:
            raise RuntimeError(f"a trainer rank failed: {self._cause(pending, e)}") from e
        self._wait(pending)
        if not state:
            return
        saved = self.optimizer.state_dict()
        saved["state"] = {index: state[name] for index, name in enumerate(self.names)}
        self.optimizer.load_state_dict(saved)

    def _wait(self, pending: list) -> None:
        try:
            self.ray.get(pending, timeout=distributed.JOIN_TIMEOUT_S)
        except Exception as e:
            raise RuntimeError(f"a trainer rank failed: {self._cause(pending, e)}") from e

    def _cause(self, pending: list, error: BaseException) -> str:
        """The first failed rank's error where one has (rank 0's is then only its consequence:
        a collective with a rank missing), else `error`: the rank and the first line."""
        done, _ = self.ray.wait(pending, num_returns=len(pending), timeout=1.0)
        for rank, ref in enumerate(pending, start=1):
            if ref not in done:
                continue
            try:
                self.ray.get(ref)
            except Exception as e:
                return f"rank {rank}: {_first_line(e)}"
        return f"rank 0: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
