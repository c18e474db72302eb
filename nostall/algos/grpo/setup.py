"""What a GRPO run builds before its first step, each part once and in this order: the prompt
source and reward functions, the model and tokenizer (and its compute copy), the prompt encoder
and the run's resolved settings, the generation side and the transport joining it to the
trainer, the optimizer and the reference model (`build`). A rollout process or Ray worker builds
its own generation side from the same recipe (`build_generator`). Checkpoint state: state.py."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.generation import (
    Generation,
    Inputs,
    build_generator,
    dtype_of,
    load_run_model,
    prompt_encoder,
    prompt_rewards,
    prompt_source,
    ray_generator,
    run_dtype,
    with_lora,
)
from nostall.algos.grpo.runtime_options import worker_gpus
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.hf_decoder import checkpointed, make_decoder
from nostall.lm.models import LanguageModel
from nostall.lm.packing import training_order
from nostall.lm.precision import MasterWeights, compute_copy
from nostall.lm.rollout import GroupGenerator
from nostall.optim import ClippedAdam
from nostall.runtime.heap import return_free_memory
from nostall.runtime.protocol import Transport
from nostall.runtime.ray.loop import RayOptions
from nostall.runtime.transports import SideRecipe, TransportOptions, open_transport

if TYPE_CHECKING:
    from nostall.algos.grpo.ranks import GRPORanks


def completion_length(args: GRPOConfig, prompt_length: int, max_positions: int) -> int:
    """args.max_new_tokens, or, where it is the default (not the user's), that cut to what the
    model's context leaves after the longest prompt."""
    if "max_new_tokens" not in args.__dict__.get("_defaulted", ()):
        return args.max_new_tokens
    return max(1, min(args.max_new_tokens, max_positions - prompt_length))


def _to_master_dtype(model: torch.nn.Module, args: GRPOConfig) -> None:
    """--master-dtype bfloat16: the parameters cast in place, one at a time (buffers, such as
    rotary tables, kept as they are, as the compute copies keep them)."""
    if args.master_dtype == "bfloat16":
        with torch.no_grad():
            for param in model.parameters():
                if param.is_floating_point():
                    param.data = param.data.to(torch.bfloat16)


def corrects_behaviour(args: GRPOConfig, dtype: torch.dtype) -> bool:
    """Whether the loss weighs each token by its behaviour weight (loss.behaviour_weights): at
    staleness >= 1 (the decoupled objective), and at staleness 0 where generation's arithmetic
    is not the trainer's float32 (--importance-sampling-correction)."""
    if args.staleness > 0:
        return True
    return args.importance_sampling_correction and dtype != torch.float32


@dataclass
class Setup:
    """Everything a run builds before its first step."""

    args: GRPOConfig  # the run's settings, resolved (the config as checked, or a copy of it)
    lm: LanguageModel  # the model trained, saved and checkpointed (the master weights)
    decoder: Decoder  # the update's forward, over `compute`
    generator: GroupGenerator | None  # the thread backend's (a process's or worker's is its own)
    loop: Transport
    optimizer: ClippedAdam
    vocab: SampledVocab | None  # the tokens the sampler may draw (None: all)
    group_index: torch.Tensor
    reference: Decoder | None
    reward_names: list[str]  # the reward functions, as metrics and the report name them
    dataset: str  # what the prompts come from, for the report
    compute: torch.nn.Module  # the model the update and generation run (lm.model in float32)
    precision: MasterWeights | None  # bf16 compute over float32 master weights, or None
    corrects: bool  # the loss weighs tokens by the behaviour ratio (see corrects_behaviour)
    # Around each optimizer step (the transport's `writing`): the thread backend's generation
    # may read these very weights; the other backends generate from copies of their own.
    writing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # --trainers M > 1: the ranks that update the model (the optimizer then holds their state
    # only at checkpoints)
    ranks: GRPORanks | None = None
    prompt_rows: int = 0  # the dataset's rows (0: a built-in task's endless prompts)

    def device_tensors(self) -> list[torch.Tensor]:
        """The run's standing tensors on its device besides the model's parameters and buffers
        (what SyncWatch must know lives there): the group index, the sampler's vocabulary, the
        compute copy's buffers and flat gradients, the lean forward's rotary tables."""
        tensors = [self.group_index]
        if self.vocab is not None:
            tensors += [self.vocab.ids, self.vocab.index]
        if self.precision is not None:
            tensors += [
                *self.compute.buffers(),
                self.precision.flat_grad,
                self.optimizer.flat_parameters,
            ]
        tensors += [
            t
            for t in (getattr(self.decoder, "cos", None), getattr(self.decoder, "sin", None))
            if t is not None
        ]
        return tensors

    @property
    def stepper(self) -> ClippedAdam | MasterWeights:
        """What the update steps: the optimizer, or the master weights around it."""
        return self.precision or self.optimizer


def _master_model(args: GRPOConfig, inputs: Inputs) -> LanguageModel:
    """The model trained (the user's, or loaded; LoRA adapters added) on the run's device, its
    parameters in the master dtype. A rollout process or worker builds its side from the same
    (`inputs.lm`)."""
    lm = with_lora(inputs.lm, args) if inputs.lm is not None else load_run_model(args, inputs)
    if inputs.lm is not None:
        inputs.lm = lm
    lm.model.to(torch.device(args.device))
    _to_master_dtype(lm.model, args)
    return lm


def _rollout(
    args: GRPOConfig,
    inputs: Inputs,
    generation: Generation,
    compute_lm: LanguageModel,
    slots: list[LMBatch],
) -> tuple[Transport, GroupGenerator | None]:
    """The transport joining the generation side to the trainer, and the side built beside
    the trainer (the thread backend's; a process or worker builds its own from the recipe)."""
    compute, device = compute_lm.model, torch.device(args.device)
    # Beside the trainer, generation reads the trainer's own weights (no copy of them, and no
    # publishing buffers): at staleness 0 no batch is generated during an update; at 1 or more
    # on the CPU the optimizer step waits for a batch's generation (or, with in-flight weights,
    # a decode step) and generation for the step (nostall/runtime/shared_weights.py). On a
    # GPU, generation keeps a copy: its kernels are queued ahead of what they read. A vLLM
    # engine holds its own copy: it reads the trainer's weights only to take them.
    share = args.staleness == 0 or device.type == "cpu" or args.generator == "vllm"
    beside: list[GroupGenerator] = []

    def build_beside() -> GroupGenerator:
        beside.append(
            build_generator(args, compute_lm, inputs=inputs, share=share, generation=generation)
        )
        return beside[0]

    recipe = SideRecipe(build_beside, functools.partial(ray_generator, args, inputs))
    loop = open_transport(
        args.backend, slots, recipe, compute, _transport_options(args, generation)
    )
    return loop, (beside[0] if beside else None)


def _transport_options(args: GRPOConfig, generation: Generation) -> TransportOptions:
    # A Ray worker's own watchdog names a hang; this bounds a worker hung whole.
    chunk_timeout = (
        args.generation_timeout + len(generation.rewards.functions) * args.reward_timeout
    )
    return TransportOptions(
        staleness=args.staleness,
        # At staleness 0 the batch is generated on the trainer's thread (one OpenMP team; see
        # RolloutLoop), its reward calls then watched from there.
        inline=args.staleness == 0,
        inflight=args.inflight_weights,
        torch_threads=args.torch_threads,
        ray=RayOptions(
            num_workers=args.num_workers,
            address=args.ray_address,
            torch_threads=args.torch_threads,
            weights=args.ray_weights,
            gpus_per_worker=worker_gpus(args, torch.device(args.device)),
            chunk_timeout_s=chunk_timeout + 60.0,
            # With trainer ranks (NCCL peers of the driver on GPUs) no worker gets the
            # driver's GPU.
            private_gpu=args.trainers > 1,
        ),
    )


def _optimizer(
    args: GRPOConfig, model: torch.nn.Module, compute: torch.nn.Module, decoder: Decoder
) -> ClippedAdam:
    # In decoder_train's order where it covers the model: the update then needs no cats.
    # (With LoRA only the adapters train: the frozen weights are not the optimizer's.)
    order = training_order(decoder if compute is model else make_decoder(model)) or [
        p for p in model.parameters() if p.requires_grad
    ]
    # (bf16 compute: the master's steps read the copy's gradients, no float32 buffer of them)
    return ClippedAdam(
        order,
        lr=args.learning_rate_at(1),
        max_grad_norm=args.max_grad_norm,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
        gradients=compute is model,
    )


def build(args: GRPOConfig, inputs: Inputs | None = None) -> Setup:
    """Model, generation side, runtime and optimizer, each built once, in this order; ValueError
    for bad input. The run's settings are `setup.args`: `args` itself is left as given (a
    default completion length cut to the model's context is a copy's)."""
    args.check()
    inputs = inputs or Inputs()
    source = prompt_source(args, inputs)
    args = args.with_steps(len(source.rows))  # (TRL's max_steps or epochs, as a copy)
    rewards = prompt_rewards(args, inputs)  # bad specs are named here, before any process starts
    lm = _master_model(args, inputs)
    model, device, dtype = lm.model, torch.device(args.device), run_dtype(args, inputs)
    # bf16 compute: a bf16 copy for generation and the update's arithmetic; the optimizer's
    # float32 weights are the model saved (MasterWeights).
    compute = model if dtype_of(model) == dtype else compute_copy(model, dtype)
    # (bad tools and environments are named here, before any process starts)
    encoder = prompt_encoder(lm, source, inputs, 0)
    length = completion_length(args, encoder.length, lm.max_positions)
    if length != args.max_new_tokens:
        args = dataclasses.replace(args, max_new_tokens=length)
        args.check()
    encoder.check_room(args.max_new_tokens, lm.max_positions)
    generation = Generation(source, rewards, encoder, dtype)
    slots = [
        LMBatch.empty(args.batch_size, encoder.length, args.max_new_tokens, device)
        for _ in range(args.staleness + 2)
    ]
    compute_lm = LanguageModel(compute, lm.tokenizer, lm.name)
    loop, generator = _rollout(args, inputs, generation, compute_lm, slots)
    decoder = checkpointed(compute) if args.gradient_checkpointing else make_decoder(compute)
    optimizer = _optimizer(args, model, compute, decoder)
    precision = None
    if compute is not model:
        precision = MasterWeights(model, optimizer, compute, args.gradient_accumulation_steps)
    reference = None
    if args.beta > 0:
        reference = make_decoder(compute_copy(model, dtype).requires_grad_(False))
    group_index = torch.arange(args.num_prompts, device=device)
    group_index = group_index.repeat_interleave(args.num_generations)
    vocab = SampledVocab.build(lm.vocab_size, lm.banned_token_ids(), device)
    if inputs.rows is not None:
        dataset = f"train_dataset ({len(source.rows)} rows)"
    else:
        dataset = args.dataset or f"task {args.task}"
    corrects = corrects_behaviour(args, dtype)
    ranks = None
    if args.trainers > 1:  # (FSDP2's modules take 0.4 s to import: only for ranks)
        from nostall.algos.grpo.ranks import GRPORanks
        from nostall.algos.grpo.sharded import RankUpdate

        update = RankUpdate(dtype, vocab, lm.eos_token_id, corrects)
        reference_model = None if reference is None else reference.model
        ranks = GRPORanks(args, model, compute, optimizer, update, reference_model)
    return_free_memory()  # (what loading, packing and copying the model freed)
    return Setup(
        args,
        lm,
        decoder,
        generator,
        loop,
        optimizer,
        vocab,
        group_index,
        reference,
        rewards.names,
        dataset,
        compute,
        precision,
        corrects,
        loop.writing,
        ranks,
        prompt_rows=len(source.rows),
    )
