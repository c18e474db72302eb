"""What a GRPO run builds before its first step, and its checkpoint state: the model and
tokenizer, the prompt source and reward functions, the generation side (engine, prompt encoder,
group generator) and the rollout loop joining it to the trainer, the optimizer and the
reference model."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.result import GRPOResult
from nostall.algos.grpo.runtime_options import worker_gpus
from nostall.lm.decoder import Decoder
from nostall.lm.generation import GenerationEngine, SampledVocab, SamplingConfig
from nostall.lm.hf_decoder import checkpointed, make_decoder
from nostall.lm.lora import apply_lora, is_peft
from nostall.lm.models import BUILTIN_SIZES, LanguageModel, load_model
from nostall.lm.packing import pack_parameters, training_order
from nostall.lm.precision import MASTER_DTYPES, MasterWeights, compute_copy, compute_dtype
from nostall.lm.rollout import GroupGenerator, LMBatch, PromptEncoder
from nostall.lm.tasks import (
    TASK_CHARACTERS,
    TASK_REWARDS,
    PromptSource,
    RewardFn,
    Rewards,
    answer_reward,
    dataset_source,
    load_reward,
    rows_source,
    task_source,
)
from nostall.lm.vllm_engine import VLLMEngine
from nostall.optim import ClippedAdam
from nostall.runtime.heap import return_free_memory
from nostall.runtime.loop import RolloutLoop
from nostall.runtime.process_loop import ProcessLoop
from nostall.runtime.ray_loop import RayLoop
from nostall.runtime.watchdog import Watchdog

if TYPE_CHECKING:
    from nostall.algos.grpo.ranks import GRPORanks


@dataclass
class Inputs:
    """What a run trains on beyond its config: the Python API's own objects (None: what the
    config names). They travel to a rollout process or Ray worker by pickling."""

    lm: LanguageModel | None = None  # the user's model and tokenizer (None: config.model)
    reward_funcs: list[RewardFn] | None = None  # callables (None: config.reward)
    rows: list[dict] | None = None  # prompt rows (None: config.dataset, or config.task)


def _rewards(args: GRPOConfig, inputs: Inputs) -> Rewards:
    weights = args.weights()
    if weights is not None and inputs.reward_funcs is None and not args.reward:
        raise ValueError("--reward-weights weighs the functions of --reward (reward_funcs): "
                         "give them, or leave the weights out")  # fmt: skip
    if inputs.reward_funcs is not None:
        return Rewards(inputs.reward_funcs, weights)
    if not args.reward:
        if not args.dataset and inputs.rows is None and args.task in TASK_REWARDS:
            functions, task_weights = TASK_REWARDS[args.task]
            return Rewards(functions, weights or task_weights)
        return Rewards([answer_reward], weights)
    return Rewards([load_reward(spec.strip()) for spec in args.reward.split(",")], weights)


def _characters(args: GRPOConfig, inputs: Inputs) -> list[str] | None:
    """The alphabet a built-in model's tokenizer needs for the run's built-in task."""
    if args.dataset or inputs.rows is not None:
        return None
    return TASK_CHARACTERS.get(args.task)


def _fit_default_length(args: GRPOConfig, lm: LanguageModel, source: PromptSource) -> None:
    """A default completion length (not the user's) cut to what the model's context leaves
    after the longest prompt."""
    if "max_new_tokens" not in args.__dict__.get("_defaulted", ()):
        return
    prompts = PromptEncoder(lm.tokenizer, source.all_prompts(), lm.max_positions, 0).length
    args.max_new_tokens = max(1, min(args.max_new_tokens, lm.max_positions - prompts))


def _with_lora(lm: LanguageModel, args: GRPOConfig) -> LanguageModel:
    """The model with LoRA adapters (args.lora_r > 0; none added to a model that has some)."""
    if not args.lora_r or is_peft(lm.model):
        return lm
    model = apply_lora(lm.model, args.lora_r, args.lora_alpha, args.lora_target_modules,
                       args.seed)  # fmt: skip
    return LanguageModel(model, lm.tokenizer, lm.name)


def _source(args: GRPOConfig, inputs: Inputs) -> PromptSource:
    if inputs.rows is not None:
        return rows_source(inputs.rows, "train_dataset")
    return dataset_source(args.dataset) if args.dataset else task_source(args.task)


def run_dtype(args: GRPOConfig, inputs: Inputs) -> torch.dtype:
    """The compute dtype of the run (`--dtype`, auto resolved for this machine and model)."""
    if args.master_dtype == "bfloat16":
        return torch.bfloat16
    builtin = inputs.lm is None and args.model in BUILTIN_SIZES
    return compute_dtype(args.dtype, torch.device(args.device), builtin)


def _to_master_dtype(model: torch.nn.Module, args: GRPOConfig) -> None:
    """--master-dtype bfloat16: the parameters cast in place, one at a time (buffers, such as
    rotary tables, kept as they are, as the compute copies keep them)."""
    if args.master_dtype == "bfloat16":
        with torch.no_grad():
            for param in model.parameters():
                if param.is_floating_point():
                    param.data = param.data.to(torch.bfloat16)


def corrects_behaviour(args: GRPOConfig, dtype: torch.dtype) -> bool:
    """Whether the loss weighs each token by min(trainer's / behaviour probability, is_cap): at
    staleness >= 1 (the decoupled objective), and at staleness 0 where generation's arithmetic
    is not the trainer's float32 (--importance-sampling-correction)."""
    if args.staleness > 0:
        return True
    return args.importance_sampling_correction and dtype != torch.float32


def _dtype_of(model: torch.nn.Module) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


@dataclass
class Setup:
    """Everything a run builds before its first step."""

    lm: LanguageModel  # the model trained, saved and checkpointed (the master weights)
    decoder: Decoder  # the update's forward, over `compute`
    generator: GroupGenerator | None  # the thread backend's (the process backend's is its own)
    loop: RolloutLoop | ProcessLoop | RayLoop
    optimizer: ClippedAdam
    vocab: SampledVocab | None  # the tokens the sampler may draw (None: all)
    group_index: torch.Tensor
    reference: Decoder | None
    reward_names: list[str]  # the reward functions, as metrics and the report name them
    dataset: str  # what the prompts come from, for the report
    compute: torch.nn.Module  # the model the update and generation run (lm.model in float32)
    precision: MasterWeights | None  # bf16 compute over float32 master weights, or None
    corrects: bool  # the loss weighs tokens by the behaviour ratio (see corrects_behaviour)
    # Around each optimizer step: the thread backend's generation may read these very weights
    # (RolloutLoop.writing); the other backends generate from copies of their own.
    writing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # --trainers M > 1: the ranks that update the model (the optimizer then holds their state
    # only at checkpoints)
    ranks: GRPORanks | None = None

    def device_tensors(self) -> list[torch.Tensor]:
        """The run's standing tensors on its device besides the model's parameters and buffers
        (what SyncWatch must know lives there): the group index, the sampler's vocabulary, the
        compute copy's buffers and flat gradients, the lean forward's rotary tables."""
        tensors = [self.group_index]
        if self.vocab is not None:
            tensors += [self.vocab.ids, self.vocab.index]
        if self.precision is not None:
            tensors += [*self.compute.buffers(), self.precision.flat_grad,
                        self.optimizer.flat_parameters]  # fmt: skip
        tensors += [t for t in (getattr(self.decoder, "cos", None),
                                getattr(self.decoder, "sin", None)) if t is not None]  # fmt: skip
        return tensors

    @property
    def stepper(self) -> ClippedAdam | MasterWeights:
        """What the update steps: the optimizer, or the master weights around it."""
        return self.precision or self.optimizer


def build_generator(args: GRPOConfig, lm: LanguageModel | None = None, seed: int | None = None,
                    inputs: Inputs | None = None,
                    share: bool = False) -> GroupGenerator:  # fmt: skip
    """The generation side: its own model copy in the run's compute dtype (of `lm`'s, or loaded
    anew: in the rollout process; `share`: `lm`'s model itself), engine, prompt source and
    reward functions; prompts and samples drawn from `seed` (default args.seed)."""
    inputs = inputs or Inputs()
    source = _source(args, inputs)
    rewards = _rewards(args, inputs)
    dtype = run_dtype(args, inputs)
    lm = lm or inputs.lm
    if lm is None:
        lm = _with_lora(load_model(args.model, args.seed, _characters(args, inputs),
                                   MASTER_DTYPES[args.master_dtype]), args)  # fmt: skip
        rollout_model = lm.model.to(torch.device(args.device))
        if _dtype_of(rollout_model) != dtype:  # (cast as the trainer's: buffers kept)
            rollout_model = compute_copy(rollout_model, dtype)
    elif share:  # (the trainer's optimizer packs its parameters as pack_parameters would)
        rollout_model = lm.model
    else:  # a copy in the run's compute dtype (bf16: half a float32 copy's memory)
        rollout_model = compute_copy(lm.model, dtype)
    encoder = PromptEncoder(lm.tokenizer, source.all_prompts(), lm.max_positions,
                            args.max_new_tokens)  # fmt: skip
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        stop_check_every=args.stop_check_every, cuda_graph=args.cuda_graph,
    )  # fmt: skip
    if args.generator == "vllm":
        engine = VLLMEngine(
            rollout_model, sampling, eos_token_id=lm.eos_token_id,
            pad_token_id=lm.pad_token_id, banned_token_ids=lm.banned_token_ids(),
            batch_size=args.batch_size, max_len=encoder.length + args.max_new_tokens,
            seed=args.seed if seed is None else seed,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            sleep=args.staleness == 0,  # (the KV cache's memory is the update's meanwhile)
        )  # fmt: skip
    else:
        decoder = make_decoder(rollout_model)
        if not share:
            pack_parameters(decoder)  # each layer's fused weights become views: no copy a batch
        engine = GenerationEngine(
            decoder, sampling, eos_token_id=lm.eos_token_id,
            pad_token_id=lm.pad_token_id, banned_token_ids=lm.banned_token_ids(),
        )  # fmt: skip
    generator = GroupGenerator(engine, encoder, source, rewards, num_prompts=args.num_prompts,
                               num_generations=args.num_generations,
                               seed=args.seed if seed is None else seed)  # fmt: skip
    # (vLLM's engine reads its inputs on the host by design: its syncs are not watched.)
    generator.watch_syncs = args.watch_syncs and args.generator == "native"
    generator.keep_texts = args.log_completions
    generator.reward_timeout_s = args.reward_timeout
    generator.generation_timeout_s = args.generation_timeout
    return generator


def ray_generator(args: GRPOConfig, inputs: Inputs, worker: int) -> GroupGenerator:
    """Ray worker `worker`'s generation side: prompts and samples of its own (seed + worker:
    worker 0's are the thread backend's)."""
    return build_generator(args, seed=args.seed + worker, inputs=inputs)


def build(args: GRPOConfig, inputs: Inputs | None = None) -> Setup:
    """Model, generation side, runtime and optimizer; ValueError for bad input."""
    args.check()
    inputs = inputs or Inputs()
    source = _source(args, inputs)
    rewards = _rewards(args, inputs)  # bad specs are named here, before any process starts
    lm = _with_lora(inputs.lm or load_model(args.model, args.seed, _characters(args, inputs),
                                            MASTER_DTYPES[args.master_dtype]), args)  # fmt: skip
    if inputs.lm is not None:
        inputs.lm = lm  # (a rollout process or worker builds its side from the same)
    device = torch.device(args.device)
    lm.model.to(device)
    model = lm.model
    _to_master_dtype(model, args)
    dtype = run_dtype(args, inputs)
    # bf16 compute: a bf16 copy for generation and the update's arithmetic; the optimizer's
    # float32 weights are the model saved (MasterWeights).
    compute = model if _dtype_of(model) == dtype else compute_copy(model, dtype)
    compute_lm = LanguageModel(compute, lm.tokenizer, lm.name)
    _fit_default_length(args, lm, source)
    encoder = PromptEncoder(lm.tokenizer, source.all_prompts(), lm.max_positions,
                            args.max_new_tokens)  # fmt: skip
    slots = [LMBatch.empty(args.batch_size, encoder.length, args.max_new_tokens, device)
             for _ in range(args.staleness + 2)]  # fmt: skip
    generator = None
    writing = contextlib.nullcontext  # (the process and Ray backends generate from copies)
    if args.backend == "ray":
        # A worker's own watchdog names a hang; this bounds a worker hung whole.
        chunk_timeout = args.generation_timeout + len(rewards.functions) * args.reward_timeout
        # With trainer ranks (NCCL peers of the driver on GPUs) no worker gets the driver's GPU.
        loop = RayLoop(slots, functools.partial(ray_generator, args, inputs), compute,
                       staleness=args.staleness, num_workers=args.num_workers,
                       address=args.ray_address, torch_threads=args.torch_threads,
                       weights=args.ray_weights, gpus_per_worker=worker_gpus(args, device),
                       chunk_timeout_s=chunk_timeout + 60.0,
                       private_gpu=args.trainers > 1)  # fmt: skip
    elif args.backend == "process":
        loop = ProcessLoop(slots, functools.partial(build_generator, args, inputs=inputs), compute,
                           staleness=args.staleness, inflight=args.inflight_weights,
                           torch_threads=args.torch_threads)  # fmt: skip
    else:
        # Generation reads the trainer's own weights (no copy of them, and no publishing
        # buffers): at staleness 0 no batch is generated during an update; at 1 or more on the
        # CPU the optimizer step waits for a batch's generation (or, with in-flight weights, a
        # decode step) and generation for the step (nostall/runtime/shared_weights.py). On a
        # GPU, generation keeps a copy: its kernels are queued ahead of what they read.
        # A vLLM engine holds its own copy: it reads the trainer's weights only to take them.
        share = args.staleness == 0 or device.type == "cpu" or args.generator == "vllm"
        generator = build_generator(args, compute_lm, inputs=inputs, share=share)
        generator.watchdog = Watchdog()
        # At staleness 0 the batch is generated on the trainer's thread (one OpenMP team; see
        # RolloutLoop), its reward calls then watched from there.
        loop = RolloutLoop(slots, generator, generator.model, compute, staleness=args.staleness,
                           watchdog=generator.watchdog, inline=args.staleness == 0)  # fmt: skip
        generator.watch_rewards_here = loop.inline
        generator.release = loop.release_weights
        if args.generator == "vllm":  # weights pushed once a version, then let go
            generator.engine.held_version = lambda: loop.rollout_version
            generator.engine.weights_taken = loop.release_weights
        writing = loop.writing
        if args.inflight_weights:
            generator.refresh = loop.refresh
    decoder = checkpointed(compute) if args.gradient_checkpointing else make_decoder(compute)
    # In decoder_train's order where it covers the model: the update then needs no cats.
    # (With LoRA only the adapters train: the frozen weights are not the optimizer's.)
    order = (training_order(decoder if compute is model else make_decoder(model))
             or [p for p in model.parameters() if p.requires_grad])  # fmt: skip
    # (bf16 compute: the master's steps read the copy's gradients, no float32 buffer of them)
    optimizer = ClippedAdam(order, lr=args.learning_rate_at(1), max_grad_norm=args.max_grad_norm,
                            weight_decay=args.weight_decay, gradients=compute is model)  # fmt: skip
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

        ranks = GRPORanks(args, model, compute, optimizer, dtype, vocab, lm.eos_token_id,
                          corrects, None if reference is None else reference.model)  # fmt: skip
    return_free_memory()  # (what loading, packing and copying the model freed)
    return Setup(lm, decoder, generator, loop, optimizer, vocab, group_index, reference,
                 rewards.names, dataset, compute, precision, corrects, writing,
                 ranks)  # fmt: skip


def snapshot(setup: Setup, step: int, result: GRPOResult) -> dict:
    """Taken inside the loop's boundary, after the step's publish, and saved there: the
    tensors are the live ones (no copy), still for the block."""
    state = {
        "model": {k: v.detach() for k, v in setup.lm.model.state_dict().items()},
        "optimizer": setup.optimizer.state_dict(),
        "optimizer_parameters": _optimizer_names(setup),
        "loop": setup.loop.state_dict(LMBatch.state_dict),
        **setup.loop.fill_state(),  # the generator's sampling and prompt streams
        "step": step,
        "rewards": list(result.rewards),
        "step_times": list(result.step_times),
    }
    if setup.reference is not None:
        state["reference"] = setup.reference.model.state_dict()
    return state


def _optimizer_names(setup: Setup) -> list[str]:
    """The parameters' names in the optimizer's order."""
    names = {id(p): name for name, p in setup.lm.model.named_parameters()}
    return [names[id(p)] for p in setup.optimizer.parameters_in_order]


def _reordered(setup: Setup, state: dict) -> dict:
    """The checkpoint's optimizer state, its entries in this optimizer's order: a checkpoint
    names its order (older ones kept model.named_parameters()'s), and the moments of one
    parameter must not be loaded into another's of the same size."""
    saved = state.get("optimizer_parameters")
    if saved is None:
        saved = [name for name, _ in setup.lm.model.named_parameters()]
    current = _optimizer_names(setup)
    optimizer = state["optimizer"]
    if saved == current:
        return optimizer
    if sorted(saved) != sorted(current):
        raise ValueError("the checkpoint's optimizer holds other parameters than this model's")
    where = {name: index for index, name in enumerate(saved)}
    entries = optimizer["state"]
    moved = {i: entries[where[name]] for i, name in enumerate(current) if where[name] in entries}
    return {**optimizer, "state": moved}


def restore(setup: Setup, state: dict, result: GRPOResult) -> int:
    model = setup.lm.model
    with torch.no_grad():
        for name, value in model.state_dict().items():
            value.copy_(state["model"][name])
    setup.optimizer.load_state_dict(_reordered(setup, state))
    if setup.precision is not None:
        setup.precision.pull_all()
    setup.loop.load_state_dict(state["loop"], setup.compute, LMBatch.load_state_dict)
    setup.loop.load_fill_state({"generator": state["generator"], "prompts": state["prompts"]})
    if setup.reference is not None:  # (loaded into the reference's dtype)
        setup.reference.model.load_state_dict(state["reference"])
    result.rewards = list(state["rewards"])
    result.step_times = list(state["step_times"])
    return int(state["step"])


def save_model(setup: Setup, out_dir) -> None:
    """The trained model and its tokenizer, loadable with transformers' from_pretrained,
    written beside out_dir and renamed into place: a failed write (a full disk) leaves no
    folder that looks like a model, and the one there before, if any, intact."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.writing-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model = setup.lm.model
        # The optimizer keeps parameters as views of one flat buffer: save standalone copies.
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.save_pretrained(staging, state_dict=state)
        setup.lm.tokenizer.save_pretrained(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():  # the previous model goes only once the new one is whole
        previous = out_dir.with_name(f".{out_dir.name}.previous-{os.getpid()}")
        out_dir.rename(previous)
        staging.rename(out_dir)
        shutil.rmtree(previous, ignore_errors=True)
    else:
        staging.rename(out_dir)
