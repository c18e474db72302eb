"""GRPO for causal language models, its generation overlapped with training.

Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300) as TRL's GRPOTrainer
runs it, with TRL's names, and the waits taken out:
- each step draws `num_prompts` prompts, samples `num_generations` completions of each with the
  rollout side's copy of the model (a native sampler, a static KV cache, no host read per
  token: nostall/lm/generation.py) and scores them with the reward functions there, off the
  trainer's critical path;
- advantages are the rewards minus their group's mean, over the group's std (`scale_rewards`
  "group"), the batch's ("batch") or not scaled ("none", Dr. GRPO): `nostall.group_advantages`;
- token log-probabilities come from the final hidden states and the output weight in chunks
  (`nostall.token_log_prob_linear`, no [B, T, V] logits), renormalised over the tokens the
  sampler may draw (special tokens other than <eos> are never sampled);
- the clipped surrogate is `nostall.clipped_policy_loss` with TRL's `loss_type`: "grpo" (per
  sequence token mean, then the mean), "bnpo" and "dapo" (mean over all tokens of the batch),
  "dr_grpo" (token sum over batch * max_new_tokens); clip [1 - clip_low, 1 + clip_high];
  optional KL to the frozen initial model (`beta`, k3 estimator) aggregated the same way;
- an optional entropy bonus (`entropy_coef`, `nostall.token_entropy_linear`, the same chunks);
- `staleness` S lets generation run up to S policy versions ahead of the trainer (S = 0:
  generate then train, exactly synchronous GRPO). Stale batches use the decoupled objective
  (AReaL, Fu et al. 2025): the clip against the proximal policy (the trainer's weights before
  the update, log-probs recomputed), each token weighted by min(pi_prox / pi_behaviour, is_cap).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

import nostall
from nostall.algos.optim import ClippedAdam
from nostall.lm.decoder import Decoder
from nostall.lm.explicit_update import explicit_update
from nostall.lm.generation import SampledVocab
from nostall.lm.rollout import LMBatch
from nostall.profiler import SyncWatch, allow
from nostall.runtime.heap import frozen_heap
from nostall.train import checkpoint
from nostall.train.grpo_setup import Setup, build, restore, snapshot

# TRL's loss_type -> clipped_policy_loss's aggregation.
AGGREGATIONS = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}
METRICS = ("loss", "clip_fraction", "approx_kl", "kl", "entropy")  # entropy: with a bonus only
# Steps whose update runs under SyncWatch (after warm-up), to report syncs per update.
WATCHED_STEPS = (3, 4)
# Arguments a resume may change; every other one must match the checkpoint's.
RESUMABLE = {"steps", "checkpoint", "checkpoint_every", "resume", "log_interval",
             "stop_when_solved", "target_reward", "watch_syncs", "backend"}  # fmt: skip


@dataclass
class Args:
    model: str = "tiny"
    """a built-in model ("tiny", "small") or a local causal LM directory"""
    task: str = "copy"
    """a built-in task (copy, reverse, sort, sum), used when no --dataset is given"""
    dataset: str | None = None
    """prompts from a JSONL file or a saved `datasets` folder (a `prompt` column; other columns
    reach the reward functions as keyword arguments)"""
    reward: str | None = None
    """reward functions as module:function, comma-separated (TRL's signature); default: the
    task's partial-credit reward against the `answer` column"""
    reward_weights: str | None = None
    """weights of the reward functions, comma-separated (default: 1 each)"""
    steps: int = 500
    """generation batches to train on (one or more optimizer steps each)"""
    num_prompts: int = 8
    """prompts per generation batch"""
    num_generations: int = 8
    """completions per prompt (the group), at least 2"""
    max_new_tokens: int = 5
    """completion length limit, in tokens"""
    temperature: float = 1.0
    """sampling temperature (the trainer's log-probs use the same)"""
    top_k: int = 0
    """sample from the k most likely tokens (0: all)"""
    top_p: float = 1.0
    """sample from the smallest set of tokens whose probability reaches top_p (1: all)"""
    learning_rate: float = 1.1e-3
    """Adam's learning rate (constant). The default is tuned for --staleness 1 (see
    benchmarks/RESULTS.md); TRL's synchronous loop (--staleness 0) uses 2e-3 and no entropy
    bonus (--entropy-coef 0)"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    loss_type: str = "dapo"
    """grpo, bnpo, dr_grpo or dapo (TRL's names)"""
    scale_rewards: str = "group"
    """divide advantages by the group's std ("group"), the batch's ("batch") or not ("none")"""
    clip_low: float = 0.2
    """the ratio is clipped below at 1 - clip_low"""
    clip_high: float | None = None
    """the ratio is clipped above at 1 + clip_high (default: clip_low)"""
    beta: float = 0.0
    """weight of the KL penalty to the initial model (k3 estimator); 0: no reference model"""
    updates_per_batch: int = 1
    """optimizer steps per generation batch (TRL's num_iterations)"""
    staleness: int = 1
    """how many policy versions generation may run ahead of training (0: synchronous GRPO, the
    same run as a generate-then-train loop; the default 1 overlaps generation with the update)"""
    inflight_weights: bool = False
    """with staleness >= 1: the generator takes weights published while it generates a batch
    between two decode steps (in flight, as PipelineRL does), each token's version recorded;
    the cached keys and values of earlier tokens are kept. Off: one version per batch"""
    is_cap: float = 2.0
    """cap of the behaviour importance weight of stale tokens (decoupled objective)"""
    entropy_coef: float = 0.05
    """weight of an entropy bonus: the loss minus entropy_coef times the sampling
    distribution's entropy per completion token, aggregated as the loss is. It keeps a group's
    completions from all becoming the same, where their advantages, and so the update, vanish
    (see benchmarks/RESULTS.md); 0: none, as TRL's GRPOTrainer"""
    stop_check_every: int = 0
    """stop generating once every completion ended, checked every this many tokens (a host
    read); 0: always generate max_new_tokens"""
    device: str = "cpu"
    """where the model, generation and update run ("cpu", "cuda", "cuda:1")"""
    backend: str = "thread"
    """where generation runs: "thread" (beside the trainer, in this process), "process" (its
    own process, CPU only: no GIL shared with the trainer) or "ray" (worker actors on a Ray
    cluster, CPU only)"""
    num_workers: int = 1
    """generation workers with --backend ray (each generates whole batches)"""
    ray_address: str | None = None
    """--backend ray: the cluster to join ("auto": the running one); default a local cluster"""
    cuda_graph: bool = True
    """on a GPU, capture each decode step as a CUDA graph (one launch per token)"""
    seed: int = 0
    """seeds the model's initialisation (built-ins), the prompts and the sampling"""
    torch_threads: int = 1
    """intra-op threads for torch"""
    target_reward: float = 0.7
    """mean reward over the last 10 steps that counts as solved (time_to_target_s)"""
    stop_when_solved: bool = False
    """stop once the target reward is reached"""
    log_interval: int = 10
    """read metrics (a host sync) every this many steps"""
    watch_syncs: bool = True
    """run two early updates under SyncWatch and report their host syncs"""
    checkpoint: str | None = None
    """save a checkpoint here every checkpoint_every steps and at the end ("{step}" in the path
    keeps one per save)"""
    checkpoint_every: int = 50
    """steps between checkpoints"""
    resume: str | None = None
    """resume from this checkpoint"""

    @property
    def batch_size(self) -> int:
        return self.num_prompts * self.num_generations

    def check(self) -> None:
        for name in ("steps", "num_prompts", "max_new_tokens", "updates_per_batch",
                     "log_interval", "checkpoint_every", "torch_threads"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be at least 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError(
                f"--num-generations must be at least 2 (a group of one has no relative "
                f"advantage), got {self.num_generations}"
            )
        caps = (("num_prompts", 1 << 16), ("num_generations", 1 << 12),
                ("max_new_tokens", 1 << 20), ("updates_per_batch", 1 << 10), ("staleness", 64),
                ("torch_threads", 1024), ("seed", (1 << 62) - 1))  # fmt: skip
        for name, cap in caps:
            if getattr(self, name) > cap:
                raise ValueError(
                    f"--{_flag(name)} must be at most {cap}, got {getattr(self, name)}"
                )
        if self.batch_size > 1 << 20:
            raise ValueError(f"--num-prompts * --num-generations must be at most {1 << 20}")
        for name in ("staleness", "top_k", "stop_check_every", "seed"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("learning_rate", "max_grad_norm", "temperature", "is_cap"):
            value = getattr(self, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"--{_flag(name)} must be a positive finite number, got {value}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {self.top_p}")
        for name in ("clip_low", "clip_high", "beta", "entropy_coef"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"--{_flag(name)} must be a finite number >= 0, got {value}")
        if not -float("inf") < self.target_reward < float("inf"):
            raise ValueError(f"--target-reward must be finite, got {self.target_reward}")
        if self.loss_type not in AGGREGATIONS:
            raise ValueError(f"--loss-type must be one of {', '.join(AGGREGATIONS)}, "
                             f"got {self.loss_type!r}")  # fmt: skip
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device} asked for, but no CUDA device is present")
        if self.backend not in ("thread", "process", "ray"):
            raise ValueError(f"--backend must be thread, process or ray, got {self.backend!r}")
        if self.backend in ("process", "ray") and device.type != "cpu":
            raise ValueError(f"--backend {self.backend} generates on the CPU; with --device "
                             f"{self.device} use --backend thread")  # fmt: skip
        if self.num_workers < 1:
            raise ValueError(f"--num-workers must be at least 1, got {self.num_workers}")
        if self.num_workers > 1 and self.backend != "ray":
            raise ValueError("--num-workers > 1 needs --backend ray")
        if self.backend == "ray" and self.inflight_weights:
            raise ValueError("--inflight-weights is not available with --backend ray (a worker "
                             "takes new weights between batches)")  # fmt: skip
        if self.inflight_weights and self.staleness < 1:
            raise ValueError("--inflight-weights needs --staleness of at least 1 (at staleness 0 "
                             "no weights are published while a batch is generated)")  # fmt: skip
        if self.scale_rewards not in nostall.ops.losses.GROUP_SCALES:
            raise ValueError(f"--scale-rewards must be group, batch or none, got "
                             f"{self.scale_rewards!r}")  # fmt: skip


def _flag(name: str) -> str:
    return name.replace("_", "-")


@dataclass
class TrainResult:
    args: dict
    rewards: list[float] = field(default_factory=list)  # mean reward of each step's batch
    step_times: list[float] = field(default_factory=list)  # seconds from start, at each step
    tokens: int = 0  # completion tokens trained on
    seconds: float = 0.0
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    generation_ms: float | None = None  # mean per batch (the rollout side)
    update_ms: float | None = None  # mean per step (the trainer side)
    syncs_per_update: float | None = None
    syncs_per_decode_step: float | None = None
    sync_sites: list[str] = field(default_factory=list)
    mean_lag: float | None = None  # versions between a batch's start and the trainer's
    mean_token_lag: float | None = None  # the same per token (differs with in-flight swaps)
    weight_swaps: int = 0  # in-flight weight swaps the generator made
    timeline: list[tuple[str, float, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged update metrics

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def note_target(self, target: float, window: int = 10) -> None:
        """Sets steps_to_target / time_to_target_s at the first step whose mean reward over
        the last `window` steps reaches `target`."""
        if self.steps_to_target is not None or len(self.rewards) < window:
            return
        if sum(self.rewards[-window:]) / window >= target:
            self.steps_to_target = len(self.rewards)
            self.time_to_target_s = self.step_times[-1]


def policy_log_probs(decoder: Decoder, batch: LMBatch, temperature: float,
                     vocab: SampledVocab | None, group_size: int) -> torch.Tensor:  # fmt: skip
    """[B, C] log-probabilities of the completion tokens under the sampling distribution (the
    model's, at `temperature`, over the tokens the sampler may draw: `vocab`, None for all);
    each group's prompt is run once."""
    return nostall.token_log_prob_linear(*policy_head(decoder, batch, temperature, vocab,
                                                      group_size))  # fmt: skip


def policy_head(decoder: Decoder, batch: LMBatch, temperature: float,
                vocab: SampledVocab | None, group_size: int):  # fmt: skip
    """(hidden [B, C, H] over the temperature, output weight [V', H], tokens [B, C] in [0, V'))
    of the sampling distribution at the completion tokens, V' the tokens the sampler may draw:
    the arguments of token_log_prob_linear (and token_entropy_linear)."""
    hidden = (
        decoder.grouped_hidden(
            batch.prompt_ids[::group_size],
            batch.prompt_mask[::group_size],
            batch.completion_ids,
            batch.completion_mask,
        )
        / temperature
    )  # (B, C, H): the states that predict the completion tokens
    weight, tokens = decoder.output_weight, batch.completion_ids
    if vocab is not None:  # the softmax over the allowed tokens' rows only
        weight, tokens = weight[vocab.ids], vocab.index[tokens]
    return hidden, weight, tokens


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str,
              max_tokens: int) -> torch.Tensor:  # fmt: skip
    """A [B, C] per-token quantity reduced as the loss type reduces the surrogate."""
    m = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    if loss_type == "dr_grpo":
        return (per_token * m).sum() / (per_token.shape[0] * max_tokens)
    return (per_token * m).sum() / m.sum().clamp(min=1)


def grpo_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor,
              mask: torch.Tensor, args: Args, behavior_log_prob: torch.Tensor | None = None,
              ref_log_prob: torch.Tensor | None = None):  # fmt: skip
    """(loss, clip_fraction, approx_kl, kl) of [B, C] token log-probs: the clipped surrogate
    aggregated as `args.loss_type`, weighted by the capped behaviour ratio when
    `behavior_log_prob` is given (decoupled objective), plus beta * k3 KL to `ref_log_prob`."""
    C = mask.shape[1]
    out = nostall.clipped_policy_loss(
        log_prob, old_log_prob, advantage, mask, args.clip_low, args.clip_high,
        AGGREGATIONS[args.loss_type], C, behavior_log_prob=behavior_log_prob,
        is_cap=args.is_cap,
    )  # fmt: skip
    loss, kl = out.loss, torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    if ref_log_prob is not None:
        delta = ref_log_prob - log_prob
        kl = aggregate(delta.exp() - delta - 1, mask, args.loss_type, C)
        loss = loss + args.beta * kl
    return loss, out.clip_fraction, out.approx_kl, kl


def grpo_update(decoder: Decoder, optimizer: ClippedAdam, batch: LMBatch, args: Args,
                vocab: SampledVocab | None, reference: Decoder | None, decoupled: bool,
                group_index: torch.Tensor,
                autograd: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """updates_per_batch optimizer steps on one batch; metrics as tensors (not read here).
    By explicit adjoints (nostall/lm/explicit_update.py) where they apply, else through
    autograd (`autograd=True` asks for it: the tests compare the two)."""
    advantage = nostall.group_advantages(batch.rewards, group_index, args.num_prompts,
                                         args.scale_rewards)  # fmt: skip
    explicit = None if autograd else explicit_update(decoder, optimizer, reference)
    G = args.num_generations
    ref_log_prob = None
    if reference is not None:
        with torch.no_grad():
            ref_log_prob = policy_log_probs(reference, batch, args.temperature, vocab, G)
    names = METRICS if args.entropy_coef else METRICS[:-1]  # (entropy: computed with a bonus)
    totals = torch.zeros(len(names), device=batch.rewards.device)
    old_log_prob = None
    C = batch.completion_mask.shape[1]
    for _ in range(args.updates_per_batch):
        if explicit is not None:  # the ops and their adjoints in turn, no autograd graph
            log_prob, loss, clip_fraction, approx_kl, entropy = explicit.step(
                batch, advantage, args, vocab, decoupled, old_log_prob
            )
            kl = torch.zeros_like(loss)  # (no reference: it applies without one)
        else:
            hidden, weight, tokens = policy_head(decoder, batch, args.temperature, vocab, G)
            log_prob = nostall.token_log_prob_linear(hidden, weight, tokens)
            loss, clip_fraction, approx_kl, kl = grpo_loss(
                log_prob, log_prob.detach() if old_log_prob is None else old_log_prob,
                advantage, batch.completion_mask, args,
                batch.log_probs if decoupled else None, ref_log_prob,
            )  # fmt: skip
            entropy = None
            if args.entropy_coef:
                entropy = aggregate(nostall.token_entropy_linear(hidden, weight),
                                    batch.completion_mask, args.loss_type, C)  # fmt: skip
                loss = loss - args.entropy_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if old_log_prob is None:  # the proximal policy: the weights before this update
            old_log_prob = log_prob.detach()
        values = [loss.detach(), clip_fraction, approx_kl, kl.detach()]
        totals += torch.stack(values if entropy is None else [*values, entropy.detach()])
    return dict(zip(names, (totals / args.updates_per_batch).unbind(), strict=True))


def train(
    args: Args,
    log: Callable[[int, dict[str, float]], None] | None = None,
    setup: Setup | None = None,
    time_limit_s: float | None = None,
) -> TrainResult:
    """Trains, calling log(step, metrics) every log_interval steps (and stopping at the first
    log past `time_limit_s` seconds, when given). `setup` (nostall.train.grpo_setup.build)
    when the caller built the run already."""
    torch.set_num_threads(args.torch_threads)
    setup = setup or build(args)
    result = TrainResult(args=asdict(args))
    first = 1
    offset = 0.0  # seconds of the run before a resume
    if args.resume:
        saved_args, state = checkpoint.load(args.resume, "grpo")
        saved_args.setdefault("entropy_coef", 0.0)  # saved before the bonus existed: none
        checkpoint.check_compatible(saved_args, asdict(args), RESUMABLE)
        first = restore(setup, state, result) + 1
        offset = result.step_times[-1] if result.step_times else 0.0
    loop, decoder, optimizer = setup.loop, setup.decoder, setup.optimizer
    syncs: list[int] = []
    lags: list[int] = []
    token_lags: list[float] = []
    metrics: dict[str, torch.Tensor] = {}
    new_tokens = 0
    step = first - 1
    if args.watch_syncs:
        SyncWatch.prepare()  # outside the run's clock
    # (A rollout process is ready when the loop's block begins: the clock starts after it.)
    with frozen_heap(), loop:
        run_start = time.perf_counter()
        start = run_start - offset  # step times count from the original run's start
        for step in range(first, args.steps + 1):
            watched = args.watch_syncs and step in WATCHED_STEPS
            watch = SyncWatch(setup.lm.model) if watched else contextlib.nullcontext()
            index, batch = loop.next_chunk()
            began = time.perf_counter()
            with watch:
                if watched:
                    # Built on the run's device before the watch began.
                    watch.mark(*batch.tensors().values(), setup.group_index)
                    if setup.vocab is not None:
                        watch.mark(setup.vocab.ids, setup.vocab.index)
                decoupled = args.staleness > 0
                metrics = grpo_update(decoder, optimizer, batch, args, setup.vocab,
                                      setup.reference, decoupled, setup.group_index)  # fmt: skip
            if watched:
                report = watch.report()
                syncs.append(report.unintended_count)
                result.sync_sites += [f"{s.location} {s.kind}" for s in report.unintended]
            lags.append(loop.lag(batch))
            token_lags.append(batch.mean_token_lag(loop.version))
            result.rewards.append(batch.reward_mean)
            result.tokens += batch.tokens
            new_tokens += batch.tokens
            loop.release(index)
            saving = args.checkpoint and (step % args.checkpoint_every == 0 or step == args.steps)
            with loop.boundary() if saving else contextlib.nullcontext():
                loop.publish(setup.lm.model)
                result.step_times.append(time.perf_counter() - start)
                result.note_target(args.target_reward)
                if saving:
                    checkpoint.save(args.checkpoint.format(step=step), "grpo", asdict(args),
                                    snapshot(setup, step, result))  # fmt: skip
            loop.timeline.record("train", began, time.perf_counter())
            if step % args.log_interval == 0 or step == args.steps:
                with allow("metrics every log_interval steps"):
                    values = {k: float(v) for k, v in metrics.items()}  # sync: logging
                recent = result.rewards[-10:]
                values.update(
                    reward=sum(recent) / len(recent), version_lag=float(lags[-1]),
                    tokens_per_second=new_tokens / (time.perf_counter() - run_start),
                )  # fmt: skip
                result.metrics = values
                if log is not None:
                    log(step, values)
                if args.stop_when_solved and result.steps_to_target is not None:
                    break
                if time_limit_s is not None and result.step_times[-1] > time_limit_s:
                    break
    result.seconds = time.perf_counter() - run_start
    result.timeline = list(loop.timeline.spans)
    result.syncs_per_update = sum(syncs) / len(syncs) if syncs else None
    stats = loop.stats  # the generation side's figures
    result.syncs_per_decode_step = stats.get("syncs_per_decode_step")
    result.sync_sites += stats.get("sync_sites", [])
    result.mean_lag = sum(lags) / len(lags) if lags else None
    result.mean_token_lag = sum(token_lags) / len(token_lags) if token_lags else None
    result.weight_swaps = stats.get("swaps", 0)
    rollout = [e - s for side, s, e in result.timeline if side == "rollout"]
    train_spans = [e - s for side, s, e in result.timeline if side == "train"]
    result.generation_ms = 1e3 * sum(rollout) / len(rollout) if rollout else None
    result.update_ms = 1e3 * sum(train_spans) / len(train_spans) if train_spans else None
    return result


if __name__ == "__main__":
    from nostall.cli import main

    raise SystemExit(main(["train", "grpo", *sys.argv[1:]]))
