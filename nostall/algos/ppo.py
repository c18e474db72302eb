"""PPO with GAE on nostall's native environments, its rollout overlapped with training.

In the spirit of CleanRL's ppo.py (Schulman et al. 2017, arXiv:1707.06347; the 37
implementation details, Huang et al. 2022), with the waits taken out:
- the environments are native and step through custom operators, writing into preallocated
  time-major chunks (no per-step allocation, no NumPy);
- actions are sampled on the device without a sync (Gumbel-max), and by default a whole
  rollout chunk (policy, sampling, environment steps) is one native call;
- GAE is the native `nostall.gae` operator, truncation-correct;
- a minibatch's loss (clipped surrogate, clipped value loss, entropy) is one `nostall.ppo_loss`
  op for discrete actions (`ppo_loss_from_log_prob` after the Gaussian's log-probabilities for
  continuous ones), and the clip plus Adam step one lean `ClippedAdam` step;
- the learning rate is a tensor, and metrics are read only every `log_interval` iterations, so
  the steady-state iteration has no host-device sync;
- a rollout thread collects the next chunk while the trainer updates on this one; with
  `staleness = 0` (the default here) the two strictly alternate: exactly synchronous PPO;
- with `device = "cuda"` the update runs on the GPU and the rollout side stays on the CPU, the
  hand-offs on streams and events (nostall/runtime/device.py).
The asynchronous variant, with V-trace correction for stale chunks, is appo.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

import nostall
import nostall.envs
from nostall.algos.agent import (
    POLICIES,
    ActorCritic,
    act,
    log_prob_entropy,
    make_agent,
    native_rollout,
)
from nostall.algos.optim import ClippedAdam
from nostall.envs.gymnasium_adapter import BACKENDS as ENV_BACKENDS
from nostall.envs.gymnasium_adapter import make_env
from nostall.policy import policy_record
from nostall.profiler import SyncWatch, allow
from nostall.runtime import Chunk, Runtime
from nostall.runtime.device import DeviceChunks
from nostall.runtime.process import ProcessRuntime
from nostall.runtime.storage import slot_layout
from nostall.train import checkpoint
from nostall.train.ppo_state import load_checkpoint, snapshot
from nostall.train.results import TrainResult

# The update's statistics, averaged over its minibatches.
METRICS = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")

# Iterations whose trainer side runs under SyncWatch, after warm-up (the optimizer's state
# exists from the first update on), to report syncs per iteration.
WATCHED_ITERATIONS = (3, 4)


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the environment: a native one, any Gymnasium id, or module:EnvClass"""
    env_backend: str = "auto"
    """auto (native when nostall has the id, else Gymnasium), native, gymnasium, or envpool"""
    frame_stack: int = 0
    """stack the last K frames of image observations into one (0: the environment's own;
    EnvPool's Atari stacks 4, Gymnasium none)"""
    total_timesteps: int = 200_000
    """environment steps to train for"""
    num_envs: int = 8
    """parallel environments"""
    num_steps: int = 128
    """steps per environment per rollout chunk"""
    # The defaults are tuned for time to solve CartPole-v1 (benchmarks/loop/bench_ppo.py): from
    # CleanRL's (lr 2.5e-3, 4 epochs) a sweep over lr, epochs, minibatches, chunk length and
    # gamma/lambda on seeds 0-3, checked on held-out seeds 4-11, found lr 5e-3 with 2 epochs
    # the fastest: about 1.6x less time to 475 (more steps, each cheaper), for appo too.
    learning_rate: float = 5e-3
    """Adam's learning rate (annealed linearly to 0 when anneal_lr)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    reward_scale: float = 1.0
    """rewards are multiplied by this before GAE (keeps value targets near unit scale)"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 2
    """passes over each chunk"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss as PPO's reference implementation does"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient clipping norm"""
    hidden: int = 64
    """hidden units per layer of the actor and the critic (the mlp policy)"""
    policy: str = "auto"
    """auto (the Nature CNN for uint8 image observations, else the MLP), mlp, or cnn"""
    staleness: int = 0
    """how many policy versions the rollout side may run ahead (0: synchronous PPO)"""
    publish_every: int = 1
    """publish the trained weights to the rollout side every this many updates (iterations)"""
    backend: str = "thread"
    """where the rollout side runs: "thread", "process" (no GIL shared with the trainer), or
    "ray" (worker actors on a Ray cluster, local or joined)"""
    num_workers: int = 1
    """rollout workers with --backend ray (each with num_envs environments)"""
    ray_address: str | None = None
    """--backend ray: the cluster to join ("auto": the running one); default a local cluster"""
    cpus_per_worker: float = 1.0
    """--backend ray: CPUs each rollout worker reserves"""
    gpus_per_worker: float = 0.0
    """--backend ray: GPUs each rollout worker reserves (one each for collective weights
    between GPUs: NCCL takes one device per rank)"""
    ray_weights: str = "store"
    """--backend ray: how weights reach the workers: "store" (one ray.put a version) or
    "collective" (broadcast by gloo, NCCL between GPUs)"""
    trainers: int = 1
    """data-parallel trainer ranks (--backend ray): each minibatch split over them, gradients
    averaged by torch.distributed (gloo on CPUs, NCCL on GPUs)"""
    native_rollout: bool = True
    """collect each chunk in one native call (the actor-critic, the sampling and the
    environments stepped in C++, GIL released); False: one policy call per step from Python"""
    seed: int = 0
    """seeds the network, the environments and both sides' generators"""
    torch_threads: int = 1
    """intra-op threads for torch (the two sides share the process's pool)"""
    device: str = "cpu"
    """where the trainer's networks and update run ("cpu", "cuda", "cuda:1"); the environments
    and the rollout side's policy copy stay on the CPU"""
    log_interval: int = 10
    """read metrics (a host sync) every this many iterations"""
    watch_syncs: bool = True
    """run two early iterations under SyncWatch and report their host syncs (costs ~0.5 s)"""
    solved_return: float | None = None
    """mean return over the last 20 episodes that counts as solved (default: the env's)"""
    stop_when_solved: bool = False
    """stop as soon as the solved return is reached"""
    checkpoint: str | None = None
    """save a checkpoint here every checkpoint_every iterations and at the end ("{iteration}"
    in the path keeps one per save)"""
    checkpoint_every: int = 50
    """iterations between checkpoints"""
    resume: str | None = None
    """resume from this checkpoint"""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_timesteps // self.batch_size)

    def check(self) -> None:
        """ValueError naming the flag for any argument out of its range (NaN included)."""
        positive = (
            "total_timesteps",
            "num_envs",
            "num_steps",
            "num_minibatches",
            "update_epochs",
            "log_interval",
            "torch_threads",
            "checkpoint_every",
            "hidden",
            "publish_every",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("staleness", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        # Sizes past these are typos, not experiments: say so rather than fail to allocate.
        for name, cap in (("num_envs", 1 << 20), ("num_steps", 1 << 20), ("hidden", 1 << 16),
                          ("staleness", 64), ("torch_threads", 1024), ("update_epochs", 1 << 16),
                          ("num_minibatches", 1 << 24)):  # fmt: skip
            if getattr(self, name) > cap:
                raise ValueError(f"{name} must be at most {cap}, got {getattr(self, name)}")
        if self.batch_size > 1 << 26:
            raise ValueError(
                f"num_envs * num_steps must be at most {1 << 26}, got {self.batch_size}"
            )
        if self.seed >= 2**62:
            raise ValueError(f"seed must be below 2**62, got {self.seed}")
        for name in ("learning_rate", "max_grad_norm", "clip_coef", "reward_scale"):
            value = getattr(self, name)
            if not (0 < value < math.inf):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in ("ent_coef", "vf_coef"):
            value = getattr(self, name)
            if not (0 <= value < math.inf):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.solved_return is not None and not math.isfinite(self.solved_return):
            raise ValueError(f"solved_return must be finite, got {self.solved_return}")
        if self.batch_size % self.num_minibatches:
            raise ValueError("num_envs * num_steps must be divisible by num_minibatches")
        if self.norm_adv and self.batch_size // self.num_minibatches < 2:
            raise ValueError(
                "a minibatch (num_envs * num_steps / num_minibatches) needs at least 2 samples "
                f"to normalise advantages, got {self.batch_size // self.num_minibatches}"
            )
        if not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError("gamma and gae_lambda must lie in [0, 1]")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.frame_stack < 0:
            raise ValueError(f"frame_stack must be >= 0, got {self.frame_stack}")
        if self.env_backend not in ENV_BACKENDS:
            raise ValueError(
                f"env_backend must be one of {', '.join(ENV_BACKENDS)}, got {self.env_backend!r}"
            )
        if self.backend not in ("thread", "process", "ray"):
            raise ValueError(f"backend must be thread, process or ray, got {self.backend!r}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {self.num_workers}")
        if self.num_workers > 1 and self.backend != "ray":
            raise ValueError("num_workers > 1 needs --backend ray")
        if self.ray_weights not in ("store", "collective"):
            raise ValueError(f"ray_weights must be store or collective, got {self.ray_weights!r}")
        if self.trainers < 1:
            raise ValueError(f"trainers must be at least 1, got {self.trainers}")
        if self.trainers > 1 and self.backend != "ray":
            raise ValueError("trainers > 1 needs --backend ray (the ranks are Ray actors)")
        if self.trainers > 1 and (self.batch_size // self.num_minibatches) % self.trainers:
            raise ValueError(f"the minibatch ({self.batch_size // self.num_minibatches} samples) "
                             "must split evenly "
                             f"over {self.trainers} trainers")  # fmt: skip
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but no CUDA device is present")


def bootstrap_values(
    agent: ActorCritic, chunk: Chunk, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(done, next_value): V of the observation after each step. Where the episode goes on,
    that observation is the next step's, whose value is `values[t + 1]` (the critic that gave
    `values`, V(obs[t]) for t < T), so the critic runs only on the chunk's last observation and
    on the last observations of truncated episodes (same-step autoreset puts the next
    episode's first observation in obs[t + 1] there, the last one in final_obs). A terminated
    episode's next value is never read: GAE and V-trace cut the bootstrap there."""
    done = chunk.terminated | chunk.truncated  # (T, N)
    next_value = torch.cat([values[1:], agent.value(chunk.obs[-1:])])
    if chunk.truncated.device.type == "cpu":
        # Host tensors: the truncated rows are read at no cost, and only they are evaluated.
        with allow("the truncated rows of a host chunk (the trainer runs on the CPU)"):
            rows = chunk.truncated.nonzero(as_tuple=True)  # sync: none, host tensors
            if len(rows[0]):
                next_value[rows] = agent.value(chunk.final_obs[rows])
    else:
        # On a device: fixed shapes, no host sync; the critic over every final_obs row.
        next_value = torch.where(chunk.truncated, agent.value(chunk.final_obs), next_value)
    return done, next_value


@dataclass
class Targets:
    """What the PPO update trains a chunk towards, all (T, N)."""

    advantage: torch.Tensor
    value_target: torch.Tensor
    old_log_prob: torch.Tensor  # the policy the ratio is taken against
    old_value: torch.Tensor  # the critic the value clip is taken against


@torch.no_grad()
def gae_advantages(agent: ActorCritic, chunk: Chunk, args: Args) -> Targets:
    """Advantages and value targets by GAE, for chunks from the current policy, with the
    rollout's values (the same critic, at staleness 0)."""
    done, next_value = bootstrap_values(agent, chunk, chunk.values)
    advantage, value_target = nostall.gae(
        chunk.rewards.float() * args.reward_scale,
        chunk.values,
        next_value,
        done,
        chunk.terminated,
        args.gamma,
        args.gae_lambda,
    )
    return Targets(advantage, value_target, chunk.log_probs, chunk.values)


AdvantageFn = Callable[[ActorCritic, Chunk, Any], Targets]


def ppo_update(
    agent: ActorCritic,
    optimizer: ClippedAdam,
    chunk: Chunk,
    targets: Targets,
    args: Args,
    generator: torch.Generator,
    rank: tuple[int, int] = (0, 1),
) -> dict[str, torch.Tensor]:
    """Clipped-surrogate epochs over one chunk. Returns metrics as tensors (not read here).
    `rank` (r, M) of M data-parallel trainers: this one trains on its 1/M of each minibatch
    (the same permutation on every rank: the same generator) and the optimizer averages the
    gradients (nostall.train.ddp)."""
    T, N = chunk.num_steps, chunk.log_probs.shape[1]
    b_obs = chunk.obs[:-1].reshape(T * N, -1)
    b_actions = chunk.actions.reshape(T * N, *chunk.actions.shape[2:])
    # The per-sample float targets side by side, so a minibatch gathers them in one op.
    per_sample = (targets.old_log_prob, targets.old_value, targets.advantage, targets.value_target)
    b_targets = torch.stack([t.reshape(-1) for t in per_sample])  # (4, T * N)
    minibatch = T * N // args.num_minibatches
    totals = torch.zeros(len(METRICS), device=b_obs.device)
    for _ in range(args.update_epochs):
        order = torch.randperm(T * N, generator=generator, device=generator.device)
        for start in range(0, T * N, minibatch):
            idx = order[start : start + minibatch]
            if rank[1] > 1:
                idx = _shard(idx, *rank)
            loss, stats = minibatch_loss(
                agent, b_obs[idx], b_actions[idx], *b_targets[:, idx], args
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()  # clips the gradients' global norm to max_grad_norm first
            totals += stats
    totals /= args.update_epochs * args.num_minibatches
    return dict(zip(METRICS, totals.unbind(), strict=True))


def minibatch_loss(
    agent: ActorCritic,
    obs: torch.Tensor,
    actions: torch.Tensor,
    old_log_prob: torch.Tensor,
    old_value: torch.Tensor,
    adv: torch.Tensor,
    value_target: torch.Tensor,
    args: Args,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, stats [5] in METRICS order) of one minibatch."""
    value_clip = args.clip_coef if args.clip_vloss else None
    logits, new_value = agent.logits_value(obs)  # one pass of a shared torso (the CNN's)
    if agent.discrete:  # the whole loss in one native op, forward and backward
        out = nostall.ppo_loss(
            logits, actions, new_value, old_log_prob, old_value, adv, value_target,
            args.clip_coef, value_clip, args.ent_coef, args.vf_coef, args.norm_adv,
        )  # fmt: skip
        return out.loss, out.stats.detach()
    # Any other policy: its log-probabilities and entropies from its distribution, the rest of
    # the loss in one native op.
    new_log_prob, entropy = log_prob_entropy(logits, actions, agent.log_std)
    out = nostall.ppo_loss_from_log_prob(
        new_log_prob, entropy, new_value, old_log_prob, old_value, adv, value_target,
        args.clip_coef, value_clip, args.ent_coef, args.vf_coef, args.norm_adv,
    )  # fmt: skip
    return out.loss, out.stats.detach()


def _make_env(args: Args):
    return _make_seeded_env(args, args.seed)


def _shard(indices: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/world of a minibatch's indices."""
    size = len(indices) // world
    return indices[rank * size : (rank + 1) * size]


def _make_seeded_env(args: Args, seed: int):
    """One Ray worker's environments, seeded apart from the other workers'."""
    return make_env(args.env_id, args.num_envs, seed=seed, backend=args.env_backend,
                    frame_stack=args.frame_stack)  # fmt: skip


def _make_runtime(args: Args, env, agent: ActorCritic) -> Runtime | ProcessRuntime:
    # The native rollout steps native environments in C++; any other env is stepped from Python.
    native = isinstance(env, nostall.envs.VectorEnv)
    rollout = native_rollout if args.native_rollout and native else None
    if args.backend == "thread":
        return Runtime(
            env, agent, act, num_steps=args.num_steps, staleness=args.staleness, seed=args.seed,
            rollout=rollout,
        )  # fmt: skip
    if args.backend == "ray":
        from nostall.runtime.ray_runtime import RayRuntime

        return RayRuntime(
            functools.partial(_make_seeded_env, args),
            functools.partial(make_agent, hidden=args.hidden, policy=args.policy),
            agent, act, num_workers=args.num_workers, num_steps=args.num_steps,
            staleness=args.staleness, seed=args.seed, rollout=rollout, address=args.ray_address,
            cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
            weights=args.ray_weights, **slot_layout(env),
        )  # fmt: skip
    return ProcessRuntime(
        functools.partial(_make_env, args),
        functools.partial(make_agent, hidden=args.hidden, policy=args.policy),
        agent,
        act,
        num_steps=args.num_steps,
        staleness=args.staleness,
        seed=args.seed,
        rollout=rollout,
        **slot_layout(env),
    )  # fmt: skip


def train(
    args: Args,
    advantage_fn: AdvantageFn = gae_advantages,
    log: Callable[[int, dict[str, float]], None] | None = None,
    algorithm: str = "ppo",
) -> TrainResult:
    """Trains, calling log(env_steps, metrics) every log_interval iterations."""
    args.check()
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    env = _make_env(args)
    if args.checkpoint:
        env.state_dict()  # an environment that cannot be saved fails now, not at the first save
    solved_return = env.info.reward_threshold if args.solved_return is None else args.solved_return
    device = torch.device(args.device)
    agent = make_agent(env, args.hidden, args.policy).to(device)
    # A tensor on the trainer's device: annealing it needs no host value.
    lr = torch.tensor(args.learning_rate, device=device)
    # Gradient clipping and fused Adam in one lean step (see optim.py).
    optimizer = ClippedAdam(agent.parameters(), lr=lr, max_grad_norm=args.max_grad_norm, eps=1e-5)
    generator = torch.Generator(device).manual_seed(args.seed + 1)
    runtime = _make_runtime(args, env, agent)
    device_chunks = DeviceChunks(runtime.slots[0], device)  # host chunks to the trainer's device
    result = TrainResult(args=asdict(args))
    first_iteration = 1
    if args.resume:
        state = load_checkpoint(args.resume, algorithm, args)
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])
        lr.copy_(state["lr"])
        for group in optimizer.param_groups:  # loading replaced it with a copy: annealing
            group["lr"] = lr  # must keep acting on the optimizer's learning rate
        generator.set_state(state["trainer_generator"])
        runtime.load_state_dict(state["runtime"], agent)
        result.curve = [tuple(point) for point in state["curve"]]
        first_iteration = state["iteration"] + 1
        result.resumed_at_steps = state["iteration"] * args.batch_size
    syncs: list[int] = []
    steps = (first_iteration - 1) * args.batch_size  # a finished run resumed: nothing to do
    if args.watch_syncs:
        SyncWatch.prepare()  # outside the run's clock
    start = time.perf_counter()
    from nostall.train.ppo_ranks import TrainerRanks  # a no-op for --trainers 1

    ranks = TrainerRanks(args, agent, optimizer, generator, advantage_fn, env)
    with runtime, ranks:  # the ranks join the cluster the runtime started
        for iteration in range(first_iteration, args.num_iterations + 1):
            lr_value = args.learning_rate
            if args.anneal_lr:
                lr_value *= 1.0 - (iteration - 1) / args.num_iterations
                lr.fill_(lr_value)
            watched = args.watch_syncs and iteration in WATCHED_ITERATIONS
            # The whole iteration, publish included, with the chunk's tensors marked as the
            # device tensors they are on a GPU.
            watch_scope = contextlib.ExitStack()
            watch = watch_scope.enter_context(SyncWatch(agent)) if watched else None
            slot, host_chunk = runtime.next_chunk()
            if watch is not None:
                watch.mark(*host_chunk.tensors().values())
            began = time.perf_counter()
            chunk = device_chunks.to_device(host_chunk)
            ranks.dispatch(host_chunk, lr_value)  # ranks 1..M-1 start on their shards
            targets = advantage_fn(agent, chunk, args)
            metrics = ppo_update(agent, optimizer, chunk, targets, args, generator,
                                 (0, args.trainers))  # fmt: skip
            ranks.wait()
            lag = runtime.lag(chunk)
            device_chunks.wait_copied()
            runtime.release(slot)
            publishes = iteration % args.publish_every == 0
            logging = iteration % args.log_interval == 0 or iteration == args.num_iterations
            if logging:  # before the publish lets the rollout side run on (with staleness 0,
                # the statistics are then exactly those of the chunks trained on so far)
                with allow("episode statistics every log_interval iterations"):
                    finished, mean_return, mean_length = runtime.episodes.recent(20)
                    # sync: logging only (the tracker's counters, on the host)
            saving = args.checkpoint and (
                iteration % args.checkpoint_every == 0 or iteration == args.num_iterations
            )
            with runtime.boundary() if saving else contextlib.nullcontext():
                runtime.publish(agent, weights=publishes)
                watch_scope.close()
                if saving:
                    checkpoint.save(
                        args.checkpoint.format(iteration=iteration), algorithm, asdict(args),
                        snapshot(agent, optimizer, lr, runtime, generator, iteration, result),
                    )  # fmt: skip
            if watch is not None:
                report = watch.report()
                syncs.append(report.unintended_count)
                result.sync_sites += [f"{s.location} {s.kind}" for s in report.unintended]
            runtime.timeline.record("train", began, time.perf_counter())
            steps = iteration * args.batch_size
            if result.first_iteration_at is None:
                result.first_iteration_at = (steps, time.perf_counter() - start)
            if logging:
                with allow("metrics every log_interval iterations"):
                    values = {k: float(v) for k, v in metrics.items()}  # sync: logging
                    values.update(lr=float(lr), version_lag=float(lag), episodes=finished)
                seconds = time.perf_counter() - start
                if mean_return is not None:
                    values.update(episode_return=mean_return, episode_length=mean_length)
                    result.curve.append((steps, seconds, mean_return))
                    if (
                        solved_return is not None
                        and result.solved_at is None
                        and mean_return >= solved_return
                    ):
                        result.solved_at = (steps, seconds)
                values["steps_per_second"] = (steps - result.resumed_at_steps) / seconds
                if log is not None:
                    log(steps, values)
                if args.stop_when_solved and result.solved_at is not None:
                    break
        # The run ends with its last update: closing the rollout side (joining a thread, a
        # process, shutting down a local Ray cluster) is not training time.
        end = time.perf_counter()
    result.syncs_per_iteration = sum(syncs) / len(syncs) if syncs else None
    loss = getattr(runtime, "loss", None)  # chunks lost with a Ray worker
    if loss is not None:
        result.dropped_chunks, result.dropped_causes = loss.dropped, list(loss.causes)
    result.steps = steps
    result.seconds = end - start
    result.timeline = list(runtime.timeline.spans)
    result.final_return = result.curve[-1][2] if result.curve else None
    result.policy = policy_record(agent, env, args)
    env.close()
    return result


if __name__ == "__main__":
    from nostall.cli import main

    raise SystemExit(main(["train", "ppo", *sys.argv[1:]]))
