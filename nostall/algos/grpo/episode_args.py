"""The settings of a GRPO run whose batches are multi-turn episodes (an environment task, such
as `--task guess`): how many turns an episode may take and how long an environment call may
run. The episode's tokens, the model's and the environment's together, fit in
max_completion_length (TRL's budget for a completion with its tool results)."""

from __future__ import annotations

from dataclasses import dataclass

# A built-in model's completion length for the tasks that need more than the toy default: an
# episode's turns and observations.
TASK_LENGTHS = {"guess": 8, "calc": 24}
# A task's turn length where --max-turn-tokens is not given (the others: up to <eos>).
TASK_TURN_TOKENS = {"guess": 1, "calc": 6}


@dataclass
class EpisodeArgs:
    """an episode's limits"""

    environment: str | None = None
    """a text environment to train in, as module:Class (or a function returning one), with
    Gymnasium's reset(seed=) and step(text) over text: each group is episodes of one seed,
    its prompt the reset observation, its reward the episode's return (None: --task's)"""
    max_tool_calling_iterations: int | None = None
    """with tools: rounds of tool calls an episode may make (TRL's; None: as many as fit in
    max_completion_length)"""
    max_turns: int = 4
    """model turns an episode may take (environment tasks); past them it ends truncated"""
    max_turn_tokens: int | None = None
    """a model turn's tokens at most: a turn ends at <eos> or there, its text the action (None:
    the task's, guess: 1, calc: 6; else up to <eos> within the episode's budget)"""
    tool_timeout: float | None = 60.0
    """seconds an environment call (reset or step) may take; past it the episode ends as
    failed, is counted and left out of the loss, and the run goes on (None: no limit)"""
    env_isolation: str = "thread"
    """where a text environment runs: "thread" (in the trainer's process, a thread a call) or
    "process" (each environment in a process of its own, started once and kept: its code never
    runs in the trainer's process, and a call past tool_timeout is ended by killing it)"""

    def turn_tokens(self, task: str) -> int | None:
        return self.max_turn_tokens or TASK_TURN_TOKENS.get(task)

    def check_episodes(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(
                f"--max-turns must be a whole number of at least 1, got {self.max_turns!r}"
            )
        rounds = self.max_tool_calling_iterations
        if rounds is not None and (not isinstance(rounds, int) or rounds < 0):
            raise ValueError(
                f"--max-tool-calling-iterations must be a whole number >= 0, got {rounds!r}"
            )
        turn = self.max_turn_tokens
        if turn is not None and (not isinstance(turn, int) or turn < 1):
            raise ValueError(
                f"--max-turn-tokens must be a whole number of at least 1, got {turn!r}"
            )
        if self.env_isolation not in ("thread", "process"):
            raise ValueError(
                f"--env-isolation must be thread or process, got {self.env_isolation!r}"
            )
        if self.tool_timeout is not None and not 0 < self.tool_timeout < float("inf"):
            raise ValueError(
                f"--tool-timeout must be a positive number of seconds, got {self.tool_timeout!r}"
            )
