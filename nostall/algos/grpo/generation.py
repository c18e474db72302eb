"""The generation side of a GRPO run: what it is built from (the config, and the Python API's
own objects: `Inputs`), its prompts and rewards (`Generation`), its engine (native or vLLM) and
the GroupGenerator filling batches. Built in the trainer's process on the thread backend, from
the parts setup.py built once; in a rollout process or a Ray worker, from the same recipe there
(`build_generator`, `ray_generator`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nostall.agents.env_process import process_pool
from nostall.agents.episodes import EpisodeRunner, EpisodeSettings
from nostall.agents.factory import EnvironmentFactory
from nostall.agents.fill import EpisodeTask
from nostall.agents.loading import hosted_environment, load_environment, seeded_rows
from nostall.agents.tasks import ENV_TASK_CHARACTERS, ENV_TASKS, HOSTED_TASKS
from nostall.agents.tools import ToolCallEnv, ToolSuffix, TurnParser, tool_schemas
from nostall.algos.grpo.config import GRPOConfig
from nostall.lm.generation import GenerationEngine, SamplingConfig
from nostall.lm.hf_decoder import make_decoder
from nostall.lm.lora import apply_lora, is_peft
from nostall.lm.models import BUILTIN_SIZES, LanguageModel, load_model
from nostall.lm.packing import pack_parameters
from nostall.lm.precision import MASTER_DTYPES, compute_copy, compute_dtype
from nostall.lm.prompt_source import PromptSource, dataset_source, rows_source
from nostall.lm.prompts import PromptEncoder
from nostall.lm.rewards import RewardFn, Rewards, load_reward
from nostall.lm.rollout import GeneratorOptions, GroupGenerator
from nostall.lm.tasks import (
    TASK_CHARACTERS,
    TASK_REWARDS,
    answer_reward,
    task_source,
)
from nostall.lm.vllm_engine import VLLMEngine, VLLMOptions

if TYPE_CHECKING:
    pass


@dataclass
class Inputs:
    """What a run trains on beyond its config: the Python API's own objects (None: what the
    config names). They travel to a rollout process or Ray worker by pickling."""

    lm: LanguageModel | None = None  # the user's model and tokenizer (None: config.model)
    reward_funcs: list[RewardFn] | None = None  # callables (None: config.reward)
    rows: list[dict] | None = None  # prompt rows (None: config.dataset, or config.task)
    tools: list | None = None  # TRL's tools=: functions the model calls (None: none)
    # TRL's environment_factory=: an instance per rollout, its methods tools (None: none)
    environment_factory: object | None = None


def environment_of(inputs: Inputs) -> EnvironmentFactory | None:
    if inputs.environment_factory is None:
        return None
    return EnvironmentFactory(inputs.environment_factory, inputs.tools or [])


def prompt_encoder(
    lm: LanguageModel, source: PromptSource, inputs: Inputs, max_new_tokens: int
) -> PromptEncoder:
    """The run's prompt encoder: sized by every prompt it may see (with an environment
    factory, each row's prompt with its reset observation), tools' schemas rendered in."""
    environment = environment_of(inputs)
    if environment is not None:
        prompts = [environment.sized_prompt(row) for row in source.rows]
        tools = environment.shared_schemas  # (None: each prompt renders its own)
    else:
        prompts = source.all_prompts()
        tools = tool_schemas(inputs.tools) if inputs.tools else None
    return PromptEncoder(lm.tokenizer, prompts, lm.max_positions, max_new_tokens, tools)


def prompt_rewards(args: GRPOConfig, inputs: Inputs) -> Rewards:
    weights = args.weights()
    if weights is not None and inputs.reward_funcs is None and not args.reward:
        raise ValueError(
            "--reward-weights weighs the functions of --reward (reward_funcs): "
            "give them, or leave the weights out"
        )
    environment = environment_of(inputs)
    if environment is not None and not environment.has_reward and inputs.reward_funcs is None:
        raise ValueError(
            "No reward source: give reward_funcs, or an environment_factory whose environment "
            "defines get_reward()"
        )
    if environment is not None and environment.has_reward:  # (TRL's: get_reward, weight 1)
        extra = environment.reward_functions()  # (a class each)
        functions = [*(inputs.reward_funcs or []), *extra]
        return Rewards(functions, weights and [*weights, *[1.0] * len(extra)])
    if inputs.reward_funcs is not None:
        return Rewards(inputs.reward_funcs, weights)
    if not args.reward:
        if not args.dataset and inputs.rows is None and args.task in TASK_REWARDS:
            functions, task_weights = TASK_REWARDS[args.task]
            return Rewards(functions, weights or task_weights)
        return Rewards([answer_reward], weights)
    return Rewards([load_reward(spec.strip()) for spec in args.reward.split(",")], weights)


def task_characters(args: GRPOConfig, inputs: Inputs) -> list[str] | None:
    """The alphabet a built-in model's tokenizer needs for the run's built-in task."""
    if args.environment or args.dataset or inputs.rows is not None:
        return None
    return TASK_CHARACTERS.get(args.task) or ENV_TASK_CHARACTERS.get(args.task)


def with_lora(lm: LanguageModel, args: GRPOConfig) -> LanguageModel:
    """The model with LoRA adapters (args.lora_r > 0; none added to a model that has some)."""
    if not args.lora_r or is_peft(lm.model):
        return lm
    model = apply_lora(lm.model, args.lora_r, args.lora_alpha, args.lora_target_modules, args.seed)
    return LanguageModel(model, lm.tokenizer, lm.name)


def load_run_model(args: GRPOConfig, inputs: Inputs) -> LanguageModel:
    """The config's model (a built-in with the task's alphabet, a directory, a cached Hub id),
    its parameters in the master dtype, LoRA adapters added."""
    characters = task_characters(args, inputs)
    lm = load_model(args.model, args.seed, characters, MASTER_DTYPES[args.master_dtype])
    return with_lora(lm, args)


def environment_maker(args: GRPOConfig):
    """--environment's or the built-in environment task's maker, a new environment a call: the
    class itself in threads (the default), or with env_isolation="process" proxies to this
    process's pool of hosts (one a concurrent episode; the prompt stream's resets share it)."""
    if args.env_isolation == "process":
        if args.environment:
            hosted = hosted_environment(args.environment)
        else:
            hosted = HOSTED_TASKS[args.task](args.max_turns)
        return process_pool(hosted, args.batch_size, args.tool_timeout).make_env
    if args.environment:
        return load_environment(args.environment)
    return functools.partial(ENV_TASKS[args.task], args.max_turns)


def in_environment(args: GRPOConfig, inputs: Inputs) -> bool:
    """Whether the run's batches are episodes in a text environment: --environment's, or a
    built-in environment task's where no prompts are given."""
    if args.environment:
        return True
    return not args.dataset and inputs.rows is None and args.task in ENV_TASKS


def prompt_source(args: GRPOConfig, inputs: Inputs) -> PromptSource:
    if in_environment(args, inputs):  # (its reset observations, one seed a group)
        name = args.environment or f"task {args.task}"
        return PromptSource(rows=[], generate=seeded_rows(environment_maker(args), name))
    if inputs.rows is not None:
        return rows_source(inputs.rows, "train_dataset")
    return dataset_source(args.dataset) if args.dataset else task_source(args.task)


def run_dtype(args: GRPOConfig, inputs: Inputs) -> torch.dtype:
    """The compute dtype of the run (`--dtype`, auto resolved for this machine and model)."""
    if args.master_dtype == "bfloat16":
        return torch.bfloat16
    builtin = inputs.lm is None and args.model in BUILTIN_SIZES
    return compute_dtype(args.dtype, torch.device(args.device), builtin)


def dtype_of(model: torch.nn.Module) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


@dataclass
class Generation:
    """What the generation side draws on, built once where it runs: the prompts, the rewards,
    their encoder and the compute dtype."""

    source: PromptSource
    rewards: Rewards
    encoder: PromptEncoder
    dtype: torch.dtype

    @classmethod
    def build(cls, args: GRPOConfig, inputs: Inputs, lm: LanguageModel) -> Generation:
        """(In a rollout process or Ray worker: its own, from the same config and inputs.)"""
        source = prompt_source(args, inputs)
        encoder = prompt_encoder(lm, source, inputs, args.max_new_tokens)
        return cls(source, prompt_rewards(args, inputs), encoder, run_dtype(args, inputs))


def _options(args: GRPOConfig, seed: int) -> GeneratorOptions:
    # (vLLM's engine reads its inputs on the host by design: its syncs are not watched.)
    return GeneratorOptions(
        watch_syncs=args.watch_syncs and args.generator == "native",
        keep_texts=args.log_completions,
        generation_timeout_s=args.generation_timeout,
        reward_timeout_s=args.reward_timeout,
        # TRL's data_seed orders the prompts (a Ray worker's offset from it as its seed's)
        data_seed=None if args.data_seed is None else args.data_seed + seed - args.seed,
    )


def make_engine(
    args: GRPOConfig,
    lm: LanguageModel,
    rollout_model: torch.nn.Module,
    generation: Generation,
    seed: int,
    share: bool,
):
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        stop_check_every=args.stop_check_every,
        cuda_graph=args.cuda_graph,
    )
    if args.generator == "vllm":
        return VLLMEngine(
            rollout_model,
            sampling,
            eos_token_id=lm.eos_token_id,
            pad_token_id=lm.pad_token_id,
            banned_token_ids=lm.banned_token_ids(),
            options=VLLMOptions(
                batch_size=args.batch_size,
                max_len=generation.encoder.length + args.max_new_tokens,
                seed=seed,
                gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                sleep=args.staleness == 0,  # (the KV cache's memory is the update's meanwhile)
            ),
        )
    decoder = make_decoder(rollout_model)
    if not share:
        pack_parameters(decoder)  # each layer's fused weights become views: no copy a batch
    return GenerationEngine(
        decoder,
        sampling,
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=lm.banned_token_ids(),
    )


def build_generator(
    args: GRPOConfig,
    lm: LanguageModel | None = None,
    seed: int | None = None,
    inputs: Inputs | None = None,
    share: bool = False,
    generation: Generation | None = None,
) -> GroupGenerator:
    """The generation side: its own model copy in the run's compute dtype (of `lm`'s, or loaded
    anew: in a rollout process; `share`: `lm`'s model itself), engine, and `generation`'s prompts
    and rewards (built here where not given: in a rollout process or Ray worker); prompts and
    samples drawn from `seed` (default args.seed)."""
    inputs = inputs or Inputs()
    seed = args.seed if seed is None else seed
    lm = lm or inputs.lm
    loaded = lm is None  # (in a rollout process or worker: the model loaded anew)
    if loaded:
        lm = load_run_model(args, inputs)
    generation = generation or Generation.build(args, inputs, lm)
    if loaded:
        rollout_model = lm.model.to(torch.device(args.device))
        if dtype_of(rollout_model) != generation.dtype:  # (cast as the trainer's: buffers kept)
            rollout_model = compute_copy(rollout_model, generation.dtype)
    else:
        # Shared: the trainer's optimizer packs its parameters as pack_parameters would. Else a
        # copy in the run's compute dtype (bf16: half a float32 copy's memory).
        rollout_model = lm.model if share else compute_copy(lm.model, generation.dtype)
    make_env = task_env(args, inputs)
    tools = inputs.tools or inputs.environment_factory is not None
    if tools and args.env_isolation == "process":
        raise ValueError(
            "--env-isolation process hosts a text environment named by --environment "
            "module:Class (or a built-in task); tools= and environment_factory= are objects "
            "of the script and run in threads (--env-isolation thread)"
        )
    engine = make_engine(args, lm, rollout_model, generation, seed, share)
    generator = GroupGenerator(
        engine,
        generation.encoder,
        generation.source,
        generation.rewards,
        num_prompts=args.num_prompts,
        num_generations=args.num_generations,
        seed=seed,
        options=_options(args, seed),
    )
    if make_env is not None:
        generator.episodes = episode_task(args, engine, lm, make_env)
    elif tools:
        generator.episodes = tool_task(args, engine, lm, inputs)
    return generator


def task_env(args: GRPOConfig, inputs: Inputs):
    """The run's environment maker: --environment's, or a built-in environment task's (None:
    prompts, not episodes)."""
    if args.environment:
        for given, name in [(args.dataset, "--dataset"), (inputs.rows, "train_dataset")]:
            if given is not None:
                raise ValueError(
                    f"--environment draws its prompts from the environment's reset: "
                    f"leave out {name}"
                )
    elif not in_environment(args, inputs):
        return None
    make_env = environment_maker(args)
    if args.reward or inputs.reward_funcs is not None:
        raise ValueError(
            "an episode's reward is its environment's return: leave out --reward (reward_funcs)"
        )
    return make_env


def tool_task(args: GRPOConfig, engine, lm: LanguageModel, inputs: Inputs) -> EpisodeTask:
    """TRL's tools=: episodes whose turns call them, until a turn calls none (or the rounds of
    max_tool_calling_iterations, or the completion budget, run out); scored by the reward
    functions over each conversation."""
    rounds = args.max_tool_calling_iterations
    settings = EpisodeSettings(
        max_turns=args.max_new_tokens if rounds is None else rounds + 1,
        budget=args.max_new_tokens,
        timeout_s=args.tool_timeout,
        eos_token_id=lm.eos_token_id,
        act_on_last_turn=False,  # (TRL's: the rounds are max_tool_calling_iterations)
    )
    tokenizer = lm.tokenizer
    suffix = ToolSuffix(tokenizer, lm.eos_token_id)
    runner = EpisodeRunner(
        engine,
        settings,
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        # (a tool call's markers may be special tokens: kept for the parser)
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
    )
    parse = TurnParser(tokenizer)  # (the tokenizer's response template, or <tool_call> JSON)
    environment = environment_of(inputs)
    if environment is not None:  # (an instance a rollout, reset with its row)
        return EpisodeTask(
            lambda instance: ToolCallEnv(environment.tools_of(instance), suffix, instance, parse),
            runner,
            scored=True,
            start=environment.start,
        )
    by_name = {tool.__name__: tool for tool in inputs.tools}
    return EpisodeTask(lambda: ToolCallEnv(by_name, suffix, None, parse), runner, scored=True)


def episode_task(args: GRPOConfig, engine, lm: LanguageModel, make_env) -> EpisodeTask:
    """Episodes run by the native engine, turn by turn, with the run's budgets."""
    settings = EpisodeSettings(
        max_turns=args.max_turns,
        budget=args.max_new_tokens,
        timeout_s=args.tool_timeout,
        eos_token_id=lm.eos_token_id,
        turn_tokens=args.turn_tokens(args.task),
    )
    tokenizer = lm.tokenizer
    runner = EpisodeRunner(
        engine,
        settings,
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    )
    return EpisodeTask(make_env, runner)


def ray_generator(args: GRPOConfig, inputs: Inputs, worker: int) -> GroupGenerator:
    """Ray worker `worker`'s generation side: prompts and samples of its own (seed + worker:
    worker 0's are the thread backend's)."""
    return build_generator(args, seed=args.seed + worker, inputs=inputs)
