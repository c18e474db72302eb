"""TRL's GRPOTrainer arguments as a run's inputs: the model (a name, a directory, a cached Hub
id, or an object with its tokenizer), reward functions (callables, "module:function", reward
models), the dataset; each recorded in the config by name where it has one, so a rollout process
or Ray worker can build the same from the config alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.generation import Inputs
from nostall.lm.models import LanguageModel, load_tokenizer_beside
from nostall.lm.reward_models import RewardModel
from nostall.lm.rewards import load_reward


def trainer_inputs(
    args: GRPOConfig, model, reward_funcs, train_dataset, processing_class
) -> Inputs:
    """The Python API's objects, recorded in the config by name where they have one."""
    inputs = Inputs()
    if isinstance(model, str | Path):
        args.model = str(model)
    elif model is not None:
        tokenizer = processing_class or load_tokenizer_beside(model)
        inputs.lm = LanguageModel(model, tokenizer, getattr(model, "name_or_path", "") or "model")
        args.model = inputs.lm.name
        args.resolve_defaults()  # (a real model's defaults where the user set none)
    if reward_funcs is not None:
        funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        if all(isinstance(f, str) for f in funcs):
            args.reward = ",".join(funcs)
        else:
            inputs.reward_funcs = [_reward(f) for f in funcs]
    if isinstance(train_dataset, str | Path):
        args.dataset = str(train_dataset)
    elif train_dataset is not None:
        inputs.rows = train_dataset
    return inputs


def reward_models(reward_funcs, processing_classes):
    """reward_funcs with each model object among them a RewardModel (its tokenizer the
    matching entry of reward_processing_classes, or the one saved beside it), as TRL's."""
    if reward_funcs is None:
        return None
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if processing_classes is not None and not isinstance(processing_classes, list | tuple):
        processing_classes = [processing_classes]
    if processing_classes is not None and len(processing_classes) != len(funcs):
        raise ValueError(
            f"reward_processing_classes: {len(processing_classes)} given for {len(funcs)} "
            "reward_funcs (one each, None where not a model)"
        )
    out = []
    for i, fn in enumerate(funcs):
        if isinstance(fn, torch.nn.Module):
            tokenizer = processing_classes[i] if processing_classes else None
            fn = RewardModel(fn, tokenizer or load_tokenizer_beside(fn))
        out.append(fn)
    return out if isinstance(reward_funcs, list | tuple) or reward_funcs is None else out[0]


def trainer_tools(args, inputs, tools, environment_factory) -> None:
    """TRL's tools= (functions the model calls in multi-turn episodes) and environment_factory=
    (an instance a rollout, its methods more tools), into `inputs`. An environment that owns
    its data needs no train_dataset (TRL's): each batch's prompts are empty user messages
    its reset fills, for max_steps."""
    if tools is not None and not isinstance(tools, list | tuple):
        raise ValueError(f"tools: a list of functions, got {type(tools).__name__}")
    inputs.tools = list(tools) if tools else None
    inputs.environment_factory = environment_factory
    if environment_factory is None or inputs.rows is not None or args.dataset:
        return
    if isinstance(environment_factory, dict):
        raise ValueError(
            "environment_factory: a dict of factories needs a train_dataset with an "
            "`environment` column to route each row to its environment (or give one factory)"
        )
    if args.steps is None and args.max_steps <= 0:
        raise ValueError(
            "environment_factory without a train_dataset (the environment's reset gives the "
            "prompt): set max_steps to the optimizer steps to train for"
        )
    empty = {"prompt": [{"role": "user", "content": ""}]}
    inputs.rows = [dict(empty) for _ in range(args.num_prompts)]


def _reward(fn) -> Callable:
    if isinstance(fn, str):
        return load_reward(fn)
    if not callable(fn):
        raise ValueError(f"reward_funcs: {fn!r} is neither a callable nor 'module:function'")
    return fn
