"""TRL's `environment_factory=`: one environment instance per rollout, its public methods the
rollout's tools, as TRL 1.16 gives them.

Per batch, each rollout gets a new instance and `reset(**row)` (the row's columns as keyword
arguments); a string it returns is appended to the last user message of the prompt (TRL's
rendering). The rollouts of one prompt share that prompt (nostall prefills a group's prompt
once), so their resets must return the same observation: a reset that differs within a group is
refused naming it. The instance's public methods (not `reset`, not `get_reward`, not `_private`)
and any standalone `tools=` are its tools (tools.py runs them); `get_reward()`, where defined,
is an extra reward function named after the class, and every reward function is given the
rollouts' instances as `environments=`.

The prompt width is fixed for a run: at the start, one probe instance is reset with every row of
the dataset to size it (reset must not cost much, or the dataset be small); a later observation
longer than any of those is refused naming the prompt.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from nostall.agents.tools import tool_schemas

_NOT_TOOLS = ("reset", "get_reward")


class EnvironmentFactory:
    """The factory and the standalone tools, with what one probe instance shows of them."""

    def __init__(self, factory: Callable[[], object], tools: list[Callable]):
        if isinstance(factory, dict):
            raise ValueError(
                "environment_factory: a dict of factories (chosen by an `environment` column) "
                "is not taken yet; give one factory"
            )
        if not callable(factory):
            raise ValueError(f"environment_factory: {factory!r} is not callable")
        self.factory, self.tools = factory, list(tools)
        probe = self.new()
        self.env_type = type(probe)
        self.has_reward = callable(getattr(probe, "get_reward", None))
        self.schemas = tool_schemas([*self.tools, *methods(probe)])

    def new(self):
        instance = self.factory()
        if not callable(getattr(instance, "reset", None)):
            raise ValueError(
                "environment_factory: each instance must define a callable reset "
                f"({type(instance).__name__} has none)"
            )
        return instance

    def tools_of(self, instance) -> dict[str, Callable]:
        """The rollout's tools by name: the standalone ones, then the instance's methods."""
        return {tool.__name__: tool for tool in [*self.tools, *methods(instance)]}

    def start(self, rows: list[dict], group_size: int) -> tuple[list, list]:
        """Each row's prompt with its observation, and group_size reset instances a row."""
        prompts, instances = [], []
        for row in rows:
            group = [self.new() for _ in range(group_size)]
            seen = [self.reset(instance, row) for instance in group]
            if any(s != seen[0] for s in seen[1:]):
                raise ValueError(
                    "environment_factory: reset gave different observations to the rollouts of "
                    f"one prompt ({seen[0]!r}, ...); nostall shares a prompt across its "
                    "num_generations rollouts"
                )
            prompts.append(with_observation(row["prompt"], seen[0]))
            instances += group
        return prompts, instances

    def sized_prompt(self, row: dict):
        """The row's prompt as a batch would see it (a probe instance reset with it)."""
        return with_observation(row["prompt"], self.reset(self.new(), row))

    @staticmethod
    def reset(instance, row: dict):
        observation = instance.reset(**row)
        if observation is not None and not isinstance(observation, str):
            raise ValueError(
                f"environment_factory: reset returned {type(observation).__name__}; TRL's "
                "reset returns None or a string"
            )
        return observation

    def reward_function(self) -> Callable | None:
        """get_reward as a reward function (None where the class has none), TRL's way."""
        if not self.has_reward:
            return None
        env_type = self.env_type

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
