"""What every trainer's config has, declared once with the checks it needs: where the run trains
(device, transport, workers, trainer ranks), its seed and threads, how it logs, when it
checkpoints and where it writes, and whether it stops once solved. PPOConfig and GRPOConfig add
their algorithms' settings to it (nostall/algos/*/config.py), each naming a setting in its
messages as its users write it (PPO by field, GRPO by flag: its TRL aliases rewrite those)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nostall.runtime.transports import check_backend
from nostall.train.checkpoint import check_path_template


@dataclass
class RunConfig:
    """The settings every run has; each is a field of every trainer's config and a flag of
    every `nostall train` command."""

    backend: str = "thread"
    """where the rollout side runs: "thread" (beside the trainer, in this process), "process"
    (a process of its own: no GIL shared with the trainer; GRPO's on the CPU) or "ray" (worker
    actors on a Ray cluster, local or joined)"""
    num_workers: int = 1
    """rollout workers with --backend ray (each with its own environments, or generating whole
    batches)"""
    ray_address: str | None = None
    """--backend ray: the cluster to join ("auto": the running one); default a local cluster"""
    ray_weights: str = "store"
    """--backend ray: how weights reach the workers: "store" (one ray.put a version) or
    "collective" (broadcast by gloo, NCCL between GPUs; a worker lost then ends the run)"""
    trainers: int = 1
    """data-parallel trainer ranks (--backend ray; rank 0 is this process, the others Ray
    actors; gloo on CPUs, NCCL on GPUs): PPO splits each minibatch over them, GRPO shards the
    model over them by FSDP2. A GRPO checkpoint resumes at any count"""
    seed: int = 0
    """seeds the run: the model's initialisation, the environments or prompts, and every
    sampling generator"""
    torch_threads: int = 1
    """intra-op threads for torch (the two sides share the process's pool)"""
    device: str = "cpu"
    """where the trainer's model and update run ("cpu", "cuda", "cuda:1")"""
    log_interval: int = 10
    """read metrics (a host sync) every this many steps"""
    watch_syncs: bool = True
    """run two early steps under SyncWatch and report their host syncs"""
    stop_when_solved: bool = False
    """stop at the first log once solved (PPO: solved_return; GRPO: target_reward)"""
    checkpoint: str | None = None
    """save a checkpoint here every checkpoint_every steps and at the end (the step in the path,
    "{step}", or PPO's "{iteration}", keeps one per save)"""
    checkpoint_every: int = 50
    """steps between checkpoints"""
    resume: str | None = None
    """resume from this checkpoint"""
    output_dir: str | None = None
    """where the run leaves its report, plots, TensorBoard logs and its policy or model (the
    command's default: a new folder under runs/; the Python API writes none without it)"""

    # The name a checkpoint path's step takes ("{step}"; PPO's "{iteration}").
    step_name = "step"

    def check_run(self, named: Callable[[str], str] = str) -> torch.device:
        """ValueError, naming the setting as `named(field)` does, for a shared setting the run
        cannot take; the trainer's device otherwise."""
        for name in (
            "log_interval",
            "checkpoint_every",
            "torch_threads",
            "num_workers",
            "trainers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{named(name)} must be at least 1, got {getattr(self, name)}")
        # Past these they are typos, not experiments: say so rather than fail to allocate.
        for name, cap in (("torch_threads", 1024), ("seed", (1 << 62) - 1)):
            if getattr(self, name) > cap:
                raise ValueError(f"{named(name)} must be at most {cap}, got {getattr(self, name)}")
        if not self.seed >= 0:
            raise ValueError(f"{named('seed')} must be >= 0, got {self.seed}")
        check_backend(self.backend, named("backend"))
        if self.num_workers > 1 and self.backend != "ray":
            raise ValueError(f"{named('num_workers')} > 1 needs --backend ray")
        if self.ray_weights not in ("store", "collective"):
            raise ValueError(
                f"{named('ray_weights')} must be store or collective, got {self.ray_weights!r}"
            )
        if self.trainers > 1 and self.backend != "ray":
            raise ValueError(
                f"{named('trainers')} > 1 needs --backend ray (ranks 1.. are Ray actors)"
            )
        check_path_template(self.checkpoint, named("checkpoint"), self.step_name)
        return self.run_device(named)

    def run_device(self, named: Callable[[str], str] = str) -> torch.device:
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"{named('device')} must be cpu, cuda or cuda:N, got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"{named('device')} {self.device!r} asked for, but no CUDA device is present"
            )
        return device
