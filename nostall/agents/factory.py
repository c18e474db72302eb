"""TRL's `environment_factory=`: one environment instance per rollout, its public methods the
rollout's tools, as TRL 1.16 gives them.

One factory, or a dict of them by name, each row's `environment` column choosing its own (its
prompt then renders its environment's tools). Instances are pooled as TRL's are: constructed
once, and per batch each rollout takes one and calls `reset(**row)` (the row's columns as
keyword arguments, the `environment` column left out); a string it returns is appended to the
last user message of the prompt (TRL's rendering). The rollouts of one prompt share that prompt
(nostall prefills a group's prompt once), so their resets must return the same observation: a
reset that differs within a group is refused naming it. The instance's public methods (not
`reset`, not `get_reward`, not `_private`) and any standalone `tools=` are its tools (tools.py
runs them); `get_reward()`, where a class defines it, is an extra reward function named after
the class, and every reward function is given the rollouts' instances as `environments=`.

The prompt width is fixed for a run: at the start, each environment's probe instance is reset
with every row of the dataset to size it (reset must not cost much, or the dataset be small); a
later observation longer than any of those is refused naming the prompt.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from nostall.agents.tools import tool_schemas
from nostall.lm.prompts import ToolPrompt

_NOT_TOOLS = ("reset", "get_reward")


class EnvironmentFactory:
    """The factories by environment name (one factory: the name None, every row's; a dict:
    each row's `environment` column picks one, as TRL's), the standalone tools, and each
    environment's instances, pooled: constructed once, reset for each batch (TRL's "construct
    once, reset often"), more made only where a batch needs more of one at once."""

    def __init__(self, factory, tools: list[Callable]):
        self.multi = isinstance(factory, dict)
        factories = dict(factory) if self.multi else {None: factory}
        if self.multi and not factories:
            raise ValueError("environment_factory: an empty dict names no environment")
        for name, made in factories.items():
            if not callable(made):
                where = f"[{name!r}]" if self.multi else ""
                raise ValueError(f"environment_factory{where}: {made!r} is not callable")
        self.factories, self.tools = factories, list(tools)
        self.pools: dict = {}  # name -> its instances, the probe first
        self.schemas: dict = {}  # name -> the tool schemas its prompts render
        self.reward_types: list[type] = []  # the classes with get_reward, each once
        for name in factories:
            probe = self.new(name)
            self.pools[name] = [probe]
            self.schemas[name] = tool_schemas([*self.tools, *methods(probe)])
            rewarded = callable(getattr(probe, "get_reward", None))
            if rewarded and type(probe) not in self.reward_types:
                self.reward_types.append(type(probe))
        self.has_reward = bool(self.reward_types)

    def new(self, name=None):
        instance = self.factories[name]()
        if not callable(getattr(instance, "reset", None)):
            raise ValueError(
                "environment_factory: each instance must define a callable reset "
                f"({type(instance).__name__} has none)"
            )
        return instance

    def tools_of(self, instance) -> dict[str, Callable]:
        """The rollout's tools by name: the standalone ones, then the instance's methods."""
        return {tool.__name__: tool for tool in [*self.tools, *methods(instance)]}

    def name_of(self, row: dict):
        """The environment a row asks for (None with one factory); ValueError naming the
        known ones where it asks for another."""
        if not self.multi:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"a row has environment={name!r}, which is not among the environments passed "
                f"to environment_factory: expected one of {list(self.factories)}"
            )
        return name

    def start(self, rows: list[dict], group_size: int) -> tuple[list, list]:
        """Each row's prompt with its observation (and, with a dict of factories, its
        environment's tool schemas), and group_size reset instances a row, drawn from the
        pools."""
        prompts, instances = [], []
        handed: dict = {}  # name -> instances handed out this batch
        for row in rows:
            name = self.name_of(row)
            pool, first = self.pools[name], handed.get(name, 0)
            while len(pool) < first + group_size:
                pool.append(self.new(name))
            handed[name] = first + group_size
            group = pool[first : first + group_size]
            seen = [self.reset(instance, row) for instance in group]
            if any(s != seen[0] for s in seen[1:]):
                raise ValueError(
                    "environment_factory: reset gave different observations to the rollouts of "
                    f"one prompt ({seen[0]!r}, ...); nostall shares a prompt across its "
                    "num_generations rollouts"
                )
            prompts.append(self.prompt(row, name, seen[0]))
            instances += group
        return prompts, instances

    def sized_prompt(self, row: dict):
        """The row's prompt as a batch would see it (its environment's probe reset with it)."""
        name = self.name_of(row)
        return self.prompt(row, name, self.reset(self.pools[name][0], row))

    def prompt(self, row: dict, name, observation):
        """The row's prompt with the observation; with a dict of factories, the prompt with
        its own environment's tool schemas (the rows of a batch differ)."""
        prompt = with_observation(row["prompt"], observation)
        return ToolPrompt(prompt, self.schemas[name]) if self.multi else prompt

    @property
    def shared_schemas(self) -> list[dict] | None:
        """The schemas every prompt renders (one factory), or None (each prompt its own)."""
        return None if self.multi else self.schemas[None]

    def reset(self, instance, row: dict):
        # (the `environment` column picks the factory: not an argument of reset, as TRL's)
        given = {k: v for k, v in row.items() if k != "environment"} if self.multi else row
        observation = instance.reset(**given)
        if observation is not None and not isinstance(observation, str):
            raise ValueError(
                f"environment_factory: reset returned {type(observation).__name__}; TRL's "
                "reset returns None or a string"
            )
        return observation

    def reward_functions(self) -> list[Callable]:
        """get_reward as a reward function per class that has one, named after it (TRL's:
        a rollout of another class scores None there)."""
        return [_get_reward(env_type) for env_type in self.reward_types]


def _get_reward(env_type: type) -> Callable:
    def get_reward(environments, **_):
        return [e.get_reward() if type(e) is env_type else None for e in environments]

    get_reward.__name__ = env_type.__name__
    return get_reward


def methods(instance) -> list[Callable]:
    """An instance's public methods, its tools (listed on the class: properties unread)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


def with_observation(prompt, observation):
    """The conversation with `observation` appended to its last message (TRL's rendering)."""
    if observation is None:
        return prompt
    if isinstance(prompt, str) or not prompt:
        raise ValueError("environment_factory needs conversational prompts (lists of messages)")
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": last["content"] + observation}]
