"""Episodes as one continuous batch (agents/continuous.py over lm/rows.py): rows fed on their own
schedules compute what a fresh forward of their contexts computes, decode_step's per-row slots
on the native and the torch path, prompts prefilled once a batch, an episode whose answer comes
back mid-turn decoding beside the turn still going, the rounds' tokens, and a timeline that grows
with the waits, not the tokens."""

import dataclasses
import time

import pytest
import torch

from nostall.agents.episodes import Episode, EpisodeSettings
from nostall.algos import grpo
from nostall.lm import rows as rows_module
from nostall.lm.rows import RowDecoder

from .test_episodes import FAST, Scripted


@pytest.fixture(scope="module")
def runner():
    runner = grpo.build(grpo.GRPOCommandConfig(**FAST)).generator.episodes.runner
    assert runner.engine.continuous  # (the tiny model's engine, default sampling)
    return runner


def _settings(runner, turn_tokens=1, budget=8, max_turns=4, timeout_s=5.0) -> EpisodeSettings:
    eos = runner.settings.eos_token_id
    return EpisodeSettings(max_turns, budget, timeout_s, eos, turn_tokens)


def _reference_logits(engine, context: list[int]) -> torch.Tensor:
    """The next-token logits of `context` from transformers' own forward of the model."""
    with torch.no_grad():
        ids = torch.tensor([context])
        return engine.model(input_ids=ids).logits[0, -1].float()


def test_rows_fed_on_their_own_schedules_compute_a_fresh_forwards_logits(runner):
    """Three rows of different prompt lengths, fed tokens on different steps (a row not named
    keeps its cache and logits): each row's logits equal transformers' forward of its whole
    context. Tolerance: float32 sums of at most a few dozen terms taken in another order (the
    native kernels' blocking against transformers' matmuls), a few ulps of logits of order 1,
    through two layers: 1e-4."""
    engine = runner.engine
    prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8, 1, 6, 2]]
    rows = RowDecoder(engine, prompts, budget=6)
    assert engine.decoder._native_kind()  # (the CPU float32 path: the native ops run)
    contexts = [list(p) for p in prompts]
    schedule = [([0], [12]), ([1, 2], [13, 14]), ([0, 2], [15, 16]), ([2], [17]), ([0, 1], [3, 5])]
    for named, tokens in schedule:
        rows.step(named, tokens)
        for r, t in zip(named, tokens, strict=True):
            contexts[r].append(t)
        for r in range(3):
            torch.testing.assert_close(
                rows.logits[r].float(),
                _reference_logits(engine, contexts[r]),
                rtol=1e-4,
                atol=1e-4,
            )
    assert rows.fed == [3, 2, 3] and rows.room(0) == 3
    with pytest.raises(ValueError, match="rows and"):
        rows.step([0, 1], [1])
    with pytest.raises(ValueError, match="prompt of at least one token"):
        RowDecoder(engine, [[1], []], budget=2)


def test_decode_step_per_row_slots_agree_on_the_native_and_the_torch_path(runner, monkeypatch):
    """The same step with a slot a row, through nostall::decode_step and through the decoder's
    torch ops: the same logits (1e-4, as above) and the same keys written at each row's slot."""
    engine = runner.engine
    decoder = engine.decoder
    prompts = [[5, 9, 11, 3], [7, 2]]

    def one_step():
        rows = RowDecoder(engine, prompts, budget=4)
        rows.step([0], [12])
        rows.step([0, 1], [13, 14])
        return rows

    native = one_step()
    monkeypatch.setattr(type(decoder), "_native_applies", lambda self: False)
    torch_ops = one_step()
    torch.testing.assert_close(native.logits, torch_ops.logits, rtol=1e-4, atol=1e-4)
    P = native.prompt_width
    for slot in (P, P + 1):
        torch.testing.assert_close(
            native.cache.keys[:, :, :, slot],
            torch_ops.cache.keys[:, :, :, slot].float(),
            rtol=1e-4,
            atol=1e-4,
        )
    assert native.slot_mask.tolist() == torch_ops.slot_mask.tolist()


def test_decode_step_names_a_slot_of_the_wrong_shape(runner):
    engine = runner.engine
    rows = RowDecoder(engine, [[5, 9], [7, 2]], budget=4)
    decoder = engine.decoder
    token = torch.tensor([1, 2])
    position = torch.tensor([2, 2])
    with torch.no_grad(), pytest.raises(RuntimeError, match="slot must be"):
        decoder.decode(token, position, torch.tensor([2, 3, 4]), rows.slot_mask, rows.cache)
    with torch.no_grad(), pytest.raises(RuntimeError, match="slot 99 outside"):
        decoder.decode(token, position, torch.tensor([2, 99]), rows.slot_mask, rows.cache)


def _episodes(runner, envs, prompt=None) -> list[Episode]:
    prompt = prompt or runner.tokenize("guess 1-8:")
    return [Episode(env, list(prompt), seed=3) for env in envs]


def test_continuous_episodes_sample_the_rounds_tokens(runner):
    """The same episodes, with staggered environment latencies, as one continuous batch and in
    rounds: the same tokens; log-probs to float32 rounding (a round's width and longest context
    change the order of the decode's sums: 1e-5)."""
    runner.settings = _settings(runner, turn_tokens=3, budget=24)
    delays = [0.0, 0.03, 0.0, 0.01, 0.05, 0.0]

    def envs():
        return [Scripted(before_step=lambda d=d: time.sleep(d)) for d in delays]

    continuous = _episodes(runner, envs())
    runner.run(continuous, noise_seed=11)
    rounds = _episodes(runner, envs())
    runner.run_rounds(rounds, noise_seed=11)
    assert [e.tokens for e in continuous] == [e.tokens for e in rounds]
    assert [e.sampled for e in continuous] == [e.sampled for e in rounds]
    assert [e.turns for e in continuous] == [e.turns for e in rounds]
    for a, b in zip(continuous, rounds, strict=True):
        torch.testing.assert_close(a.log_probs, b.log_probs, rtol=1e-5, atol=1e-5)


def test_an_answer_back_mid_turn_decodes_beside_the_turn_still_going(runner, monkeypatch):
    """Episode 0 never ends a turn before its budget (its <eos> draws replaced), episode 1 ends
    each at one token (its draws replaced by <eos>) and its environment answers at once. Rounds
    would hold episode 1 until episode 0's turn ended; here it takes all its turns while that
    turn goes on: steps sample both, episode 1 past its first turn. The prompts are prefilled
    once for the whole batch."""
    runner.settings = _settings(runner, turn_tokens=None, budget=96, max_turns=3)
    eos, vocab = runner.settings.eos_token_id, runner.engine.allowed.shape[0]
    samples, prefills = [], []
    real_sample, real_init = RowDecoder.sample, RowDecoder.__init__

    def forced(self, keys, uniform):
        tokens, log_probs = real_sample(self, keys, uniform)
        samples.append(list(keys))
        tokens = [
            eos if k == 1 else (t if t != eos else (t + 1) % vocab)
            for k, t in zip(keys, tokens, strict=True)
        ]
        return tokens, log_probs

    def counted(self, *args, **kwargs):
        prefills.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(rows_module.RowDecoder, "sample", forced)
    monkeypatch.setattr(rows_module.RowDecoder, "__init__", counted)
    episodes = _episodes(runner, [Scripted(endless=True), Scripted(endless=True)])
    stats = runner.run(episodes, noise_seed=5)
    assert prefills == [1]
    assert episodes[1].turns == 3 and episodes[1].done
    assert episodes[0].turns == 1 and episodes[0].truncated  # (one turn, to the budget)
    # Episode 1's turns 2 and 3 were sampled in steps that sampled episode 0's first turn too.
    assert samples.count([0, 1]) >= 3, samples[:12]
    assert stats.rounds >= 90


def test_a_batchs_timeline_grows_with_its_waits_not_its_tokens(runner):
    """Decode spans are stretches between idle waits: hundreds of steps, a handful of spans."""
    runner.settings = _settings(runner, turn_tokens=8, budget=64, max_turns=6)
    episodes = _episodes(runner, [Scripted(endless=True) for _ in range(4)])
    stats = runner.run(episodes, noise_seed=2)
    kinds = [kind for kind, _, _ in stats.spans]
    assert stats.rounds >= 20
    assert kinds.count("decode") <= kinds.count("idle") + 1
    assert kinds.count("tool") == stats.env_calls


def test_an_engine_that_processes_logits_runs_episodes_in_rounds(runner, monkeypatch):
    """min_p and the repetition penalty are applied by generate() alone: such an engine says it
    cannot run a continuous batch, and the runner takes rounds (the same episodes still end)."""
    engine = runner.engine
    monkeypatch.setattr(engine, "sampling", dataclasses.replace(engine.sampling, min_p=0.05))
    assert not engine.continuous
    made = []
    monkeypatch.setattr(
        rows_module.RowDecoder, "__init__", lambda self, *a, **k: made.append(1) or 1 / 0
    )
    runner.settings = _settings(runner, turn_tokens=2, budget=12)
    episodes = _episodes(runner, [Scripted() for _ in range(3)])
    runner.run(episodes, noise_seed=4)
    assert made == [] and all(e.done for e in episodes)


@pytest.mark.parametrize("continuous", [True, False])
def test_inflight_weights_are_taken_between_steps_and_each_token_keeps_its_version(
    runner, continuous
):
    """A swap function publishing new weights at a later call (the sixth step's; rounds: the
    third round's): the tokens sampled before it
    are version 0's, after it version 1's (in sampling order, one swap counted), every sampled
    token has its version, and the run's first tokens are the unswapped run's while later
    log-probs are not (the new weights took effect mid-batch)."""
    runner.settings = _settings(runner, turn_tokens=4, budget=24, max_turns=3)
    model = runner.engine.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    after = {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in before.items()}
    run = runner.run if continuous else runner.run_rounds

    def envs():
        return [Scripted(endless=True) for _ in range(3)]

    plain = _episodes(runner, envs())
    run(plain, noise_seed=9)
    calls, at = [], 6 if continuous else 3

    def swap() -> int:
        calls.append(1)
        if len(calls) == at:
            model.load_state_dict(after)
        return int(len(calls) >= at)

    swapped = _episodes(runner, envs())
    try:
        stats = run(swapped, noise_seed=9, swap=swap)
    finally:
        model.load_state_dict(before)
    versions = stats.token_versions
    assert stats.swaps == 1 and versions == sorted(versions) and {0, 1} <= set(versions)
    assert len(versions) == sum(sum(e.sampled) for e in swapped)
    assert [e.tokens[0] for e in swapped] == [e.tokens[0] for e in plain]
    assert [e.log_probs[0] for e in swapped] == [e.log_probs[0] for e in plain]
    assert [e.log_probs for e in swapped] != [e.log_probs for e in plain]


def test_a_guessing_game_run_with_inflight_weights_reports_its_token_lag():
    args = grpo.GRPOCommandConfig(**dict(FAST, steps=6), staleness=1, inflight_weights=True)
    result = grpo.train(args)
    assert len(result.rewards) == 6
    assert 0 <= result.mean_token_lag <= result.mean_lag <= 1
