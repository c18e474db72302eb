"""Multi-turn episodes, decoded while their environments work.

Each episode alternates a model turn (tokens sampled up to <eos>) and an environment step on
that turn's text, whose observation is appended as tokens (token in, token out: the
conversation is never re-tokenized). No sequence that could decode waits for another's
environment: every finished turn's step goes to a thread of its own (env_calls.py), and the
decoder waits only when no episode is ready. Where the engine can, the episodes are one
continuous batch (continuous.py): a step at a time, each episode's cache kept across its turns,
an answer fed at the next step. Elsewhere (an engine that processes logits: min_p, a repetition
penalty), in rounds: each round decodes every ready episode until its turn ends, contexts
prefilled again. A turn's tokens are drawn with noise keyed by (episode, position), so an
episode samples the same tokens whatever decodes beside it, either way.

A turn ends at <eos> or at `turn_tokens` (its text, either way, is the action). Budgets:
`max_turns` model turns, and the episode's tokens (model and environment together) in
the batch's completion length. An episode that runs out of either is truncated; one whose
environment raises, times out or returns garbage ends as failed, with its cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nostall.agents.continuous import run_continuous
from nostall.agents.env_calls import EnvCalls, bound
from nostall.agents.stats import RoundStats
from nostall.agents.text_env import EnvError, check_reset, check_step
from nostall.agents.turn_noise import TurnNoise, turn_seed


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int  # model turns an episode may take
    budget: int  # its tokens after the prompt, model and environment together
    timeout_s: float | None  # each environment call (None: no limit)
    eos_token_id: int
    turn_tokens: int | None = None  # a turn's tokens at most (None: up to <eos>)
    # Whether the last turn allowed (max_turns) is still handed to the environment: a text
    # environment's last action scores; TRL's tool rounds end there, the last turn's calls unrun.
    act_on_last_turn: bool = True


@dataclass
class Episode:
    """One episode's tokens after its prompt, which of them the model sampled (the loss's), their
    log-probs (0 for the environment's), its return and how it ended."""

    env: object
    prompt: list[int]
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    truncated: bool = False
    failure: str | None = None  # why the environment failed it (None: it did not)
    env_seconds: float = 0.0
    calls: int = 0  # environment steps, or the tool calls a tool environment reports
    call_failures: int = 0  # of those, the ones that failed


class EpisodeRunner:
    """Runs a batch of episodes to their ends with a generation engine (generate_turn)."""

    def __init__(
        self,
        engine,
        settings: EpisodeSettings,
        tokenize: Callable[[str], list[int]],
        detokenize: Callable[[list[int]], str],
    ):
        self.engine, self.settings = engine, settings
        self.tokenize, self.detokenize = tokenize, detokenize

    def run(
        self, episodes: list[Episode], noise_seed: int, swap: Callable[[], int] | None = None
    ) -> RoundStats:
        """Every episode reset, then turns until each is done; returns the batch's timings. As
        a continuous batch where the engine can (continuous.py), else in rounds. `swap`, when
        given (in-flight weights), takes newer weights if published and returns the version
        held: between two steps, or two rounds."""
        if getattr(self.engine, "continuous", False):
            return run_continuous(self, episodes, noise_seed, swap)
        return self.run_rounds(episodes, noise_seed, swap)

    def run_rounds(
        self, episodes: list[Episode], noise_seed: int, swap: Callable[[], int] | None = None
    ) -> RoundStats:
        """Decode rounds: each round decodes every episode ready when it starts until each
        one's turn ends; episodes whose calls come back meanwhile join the next round, their
        contexts prefilled again."""
        stats = RoundStats()
        version = swap() if swap is not None else None
        calls = EnvCalls(self.settings.timeout_s)
        waiting: dict[int, str] = {}  # episode -> the call it waits on ("reset" or "step")
        for key, episode in enumerate(episodes):
            waiting[key] = "reset"
            calls.submit(key, bound(episode.env.reset, seed=episode.seed))
        ready: list[int] = []
        spans = stats.spans
        while waiting or ready:
            began, wall = time.perf_counter(), time.time()
            finished = calls.collect(wait=not ready)
            if not ready:
                stats.wait_s += time.perf_counter() - began
                spans.append(("idle", wall, time.time()))
            for result in finished:
                kind = waiting.pop(result.key)
                stats.env_calls += 1
                spans.append(("tool", result.started, result.started + result.seconds))
                if self.answered(episodes[result.key], kind, result):
                    ready.append(result.key)
            if ready:
                began, wall = time.perf_counter(), time.time()
                if swap is not None and (held := swap()) != version:
                    version, stats.swaps = held, stats.swaps + 1  # (a round freezes anew)
                before = sum(len(episodes[k].tokens) for k in ready)
                self._turn([episodes[k] for k in ready], ready, noise_seed, calls, waiting)
                if swap is not None:  # (a round's tokens: its sampled ones, all one version)
                    sampled = sum(len(episodes[k].tokens) for k in ready) - before
                    stats.token_versions += [version] * sampled
                stats.decode_s += time.perf_counter() - began
                spans.append(("decode", wall, time.time()))
                stats.rounds += 1
                ready = []
        return stats

    def answered(self, episode: Episode, kind: str, result) -> bool:
        """Applies an environment's answer; whether the episode goes on to another turn."""
        episode.env_seconds += result.seconds
        try:
            if result.error is not None:
                raise EnvError(f"{kind} raised {type(result.error).__name__}: {result.error}")
            if kind == "reset":
                check_reset(result.value)
                return True
            observation, reward, terminated, truncated, info = check_step(result.value)
        except EnvError as e:
            episode.failure, episode.done = str(e), True
            episode.call_failures += kind == "step"
            episode.calls += kind == "step"
            return False
        episode.calls += int(info.get("tool_calls", 1))
        episode.call_failures += int(info.get("tool_failures", 0))
        episode.reward += reward
        if terminated or truncated or episode.turns >= self.settings.max_turns:
            episode.done, episode.truncated = True, truncated or not terminated
            return False
        ids = observation if isinstance(observation, list) else self.tokenize(observation)
        if len(episode.tokens) + len(ids) >= self.settings.budget:  # (no room left to answer)
            episode.done, episode.truncated = True, True
            return False
        episode.tokens += ids
        episode.sampled += [False] * len(ids)
        episode.log_probs += [0.0] * len(ids)
        return True

    def _turn(self, episodes, keys, noise_seed, calls: EnvCalls, waiting) -> None:
        """One decode round over `episodes`; each finished turn's step handed to its thread."""
        budget = self.settings.budget
        room = [budget - len(e.tokens) for e in episodes]
        starts = [len(e.tokens) for e in episodes]
        noise = TurnNoise(
            [turn_seed(noise_seed, key, start) for key, start in zip(keys, starts, strict=True)],
            self.engine.allowed.shape[0],
            self.engine.allowed.device,
        )
        contexts = [e.prompt + e.tokens for e in episodes]
        cap = self.settings.turn_tokens or budget
        out = self.engine.generate_turn(contexts, min(max(room), cap), noise)
        lengths = out.completion_mask.sum(1).tolist()  # sync: the turns' texts go to the envs
        ids, log_probs = out.completion_ids.tolist(), out.log_probs.tolist()  # sync: (likewise)
        for row, (episode, key) in enumerate(zip(episodes, keys, strict=True)):
            n = min(lengths[row], room[row], cap)
            turn = ids[row][:n]
            episode.tokens += turn
            episode.sampled += [True] * n
            episode.log_probs += log_probs[row][:n]
            self.act(episode, key, turn, calls, waiting)

    def act(self, episode: Episode, key: int, turn: list[int], calls: EnvCalls, waiting) -> None:
        """A turn's tokens are in the episode: its text goes to the environment as the action
        (the call submitted, `waiting` told), or the episode ends (cut off by its budget before
        a whole action, or its last turn's action not taken)."""
        episode.turns += 1
        eos, cap = self.settings.eos_token_id, self.settings.turn_tokens or self.settings.budget
        ended = bool(turn) and turn[-1] == eos
        if not ended and len(turn) < cap:  # cut off by the budget: no whole action to take
            episode.done, episode.truncated = True, True
            return
        action = self.detokenize(turn[:-1] if ended else turn)
        if episode.turns >= self.settings.max_turns and not self.settings.act_on_last_turn:
            episode.done, episode.truncated = True, True  # (its calls: past the rounds)
            record = getattr(episode.env, "last_turn", None)  # (kept for the rewards)
            if record is not None:
                record(action)
            return
        waiting[key] = "step"
        calls.submit(key, bound(episode.env.step, action))
