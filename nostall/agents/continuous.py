"""Episodes as one continuous batch: a decode step at a time, each episode's cache kept across
its turns (lm/rows.py).

Every prompt is prefilled once, while the environments reset. Then each step samples a token for
every episode in a turn and feeds one token to every episode that has one to take: the token it
just sampled, or the next of its environment's answer (token in, token out). An episode whose
turn ends hands its action to its environment and drops out of the steps; the step after its
answer comes back, it is fed that answer and goes on, whatever the others are doing: no episode
waits for a round to end, and no context is read twice. The decoder waits only when no episode
has anything to decode.

The tokens are the rounds' (EpisodeRunner.run_rounds): a turn draws its noise from the same
stream, keyed by where it starts, one draw a token.

With in-flight weights (`swap`), weights published while the batch decodes are taken between two
steps, the keys and values already cached kept (as PipelineRL does); each sampled token's
behaviour log-prob is its version's, and the versions are counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nostall.agents.env_calls import EnvCalls, bound
from nostall.agents.stats import RoundStats
from nostall.agents.turn_noise import turn_seed
from nostall.lm.rows import RowDecoder


@dataclass
class _Turn:
    noise: torch.Generator  # the turn's stream (turn_seed)
    limit: int  # its tokens at most: the turn cap, or the episode's room if less
    tokens: list[int]


class _Clock:
    """The batch's decode stretches and idle waits, into RoundStats (merged spans: one a stretch
    of steps, not one a step, so the timeline grows with the waits, not the tokens)."""

    def __init__(self, stats: RoundStats):
        self.stats = stats
        self.since: tuple[float, float] | None = None  # (perf, wall) the stretch began

    def decoding(self) -> None:
        if self.since is None:
            self.since = (time.perf_counter(), time.time())

    def pause(self) -> None:
        if self.since is not None:
            began, wall = self.since
            self.stats.decode_s += time.perf_counter() - began
            self.stats.spans.append(("decode", wall, time.time()))
            self.since = None


def run_continuous(
    runner, episodes: list, noise_seed: int, swap: Callable[[], int] | None = None
) -> RoundStats:
    """Runs `episodes` to their ends with runner's engine, settings, answered() and act().
    `swap`, when given, takes newer weights if published and returns the version held."""
    settings, engine = runner.settings, runner.engine
    stats = RoundStats()
    clock = _Clock(stats)
    calls = EnvCalls(settings.timeout_s)
    waiting: dict[int, str] = {}  # episode -> the call it waits on ("reset" or "step")
    for key, episode in enumerate(episodes):
        waiting[key] = "reset"
        calls.submit(key, bound(episode.env.reset, seed=episode.seed))
    version = swap() if swap is not None else None
    clock.decoding()
    prompts = [e.prompt for e in episodes]
    rows = RowDecoder(engine, prompts, settings.budget, _group_size(prompts))
    clock.pause()
    vocab, eos = engine.allowed.shape[0], settings.eos_token_id
    cap = settings.turn_tokens or settings.budget
    turns: dict[int, _Turn] = {}  # episodes in a turn
    ready: set[int] = set()  # of those, the ones whose logits are the next token's
    feed: dict[int, list[int]] = {}  # episodes with tokens to take before they sample again
    unfed: dict[int, int] = {}  # a turn's last token, fed with the environment's answer

    def start_turn(key: int) -> None:
        episode = episodes[key]
        start = len(episode.tokens)
        noise = torch.Generator().manual_seed(turn_seed(noise_seed, key, start))
        turns[key] = _Turn(noise, min(cap, rows.room(key)), [])  # (all its tokens fed)
        ready.add(key)

    while waiting or feed or ready:
        busy = bool(feed or ready)
        if not busy:
            clock.pause()
            began, wall = time.perf_counter(), time.time()
        finished = calls.collect(wait=not busy)
        if not busy:
            stats.wait_s += time.perf_counter() - began
            stats.spans.append(("idle", wall, time.time()))
        for result in finished:
            kind = waiting.pop(result.key)
            stats.env_calls += 1
            stats.spans.append(("tool", result.started, result.started + result.seconds))
            episode = episodes[result.key]
            before = len(episode.tokens)
            goes_on = runner.answered(episode, kind, result)
            last = unfed.pop(result.key, None)
            if not goes_on:
                continue
            if kind == "reset":  # (the prompt's logits are the first token's)
                start_turn(result.key)
            else:
                feed[result.key] = [last, *episode.tokens[before:]]
        if not (feed or ready):
            continue
        clock.decoding()
        if swap is not None and (held := swap()) != version:
            engine.decoder.freeze()  # (the fused weights from the new ones; the cache kept)
            version, stats.swaps = held, stats.swaps + 1
        if ready:
            keys = sorted(ready)
            uniform = torch.stack([torch.rand(vocab, generator=turns[k].noise) for k in keys])
            tokens, log_probs = rows.sample(keys, uniform)
            ready.clear()
            if swap is not None:
                stats.token_versions += [version] * len(keys)
            for key, token, log_prob in zip(keys, tokens, log_probs, strict=True):
                episode, turn = episodes[key], turns[key]
                episode.tokens.append(token)
                episode.sampled.append(True)
                episode.log_probs.append(log_prob)
                turn.tokens.append(token)
                if token == eos or len(turn.tokens) >= turn.limit:
                    del turns[key]
                    unfed[key] = token
                    runner.act(episode, key, turn.tokens, calls, waiting)
                else:
                    feed[key] = [token]
        if feed:
            keys = sorted(feed)
            rows.step(keys, [feed[k].pop(0) for k in keys])
            stats.rounds += 1
            for key in keys:
                if feed[key]:
                    continue
                del feed[key]
                if key in turns:
                    ready.add(key)
                else:
                    start_turn(key)
    clock.pause()
    return stats


def _group_size(prompts: list[list[int]]) -> int:
    """G where the prompts come in runs of G equal ones (a GRPO group's episodes): each run is
    prefilled once; else 1."""
    g = 1
    while g < len(prompts) and prompts[g] == prompts[0]:
        g += 1
    if len(prompts) % g or any(prompts[i] != prompts[i - i % g] for i in range(len(prompts))):
        return 1
    return g
