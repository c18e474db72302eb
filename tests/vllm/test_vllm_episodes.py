"""Multi-turn episodes with vLLM generating (VLLMEngine.generate_turn, EpisodeRunner's rounds):
a text environment's episodes (tests/agents' Echo: say back the letter shown, three turns) are
well formed (the environment's answers between the turns, out of the loss), their behaviour
log-probs are the trainer's on the same weights, a turn draws the same tokens whatever round it
joins, and a run with failing environments goes on, counting them."""

import time

import pytest
import torch

from nostall.agents.episodes import Episode
from nostall.algos import grpo
from nostall.algos.grpo.setup import build
from tests.agents.text_envs import Echo
from tests.lm.log_probs import trainer_log_probs

pytestmark = pytest.mark.vllm

ATOL = 1e-5  # float32 on both sides: operation order only (test_vllm_engine.py)


def _args(model_dir, environment: str, **settings) -> grpo.GRPOConfig:
    """One-letter turns in a tests/agents text environment, vLLM generating in float32."""
    return grpo.GRPOCommandConfig(
        **{
            "model": str(model_dir),
            "generator": "vllm",
            "dtype": "float32",
            "task": "copy",
            "environment": f"tests.agents.text_envs:{environment}",
            "max_turn_tokens": 1,
            "max_new_tokens": 8,
            "staleness": 0,
            "num_generations": 2,
            "watch_syncs": False,
            **settings,
        }
    )


@pytest.fixture(scope="module")
def run(model_dir):
    args = _args(model_dir, "make_echo", num_prompts=2, num_generations=4, learning_rate=1e-3)
    setup = build(args)
    assert not getattr(setup.generator.engine, "continuous", False)  # (vLLM: rounds)
    yield setup, args
    setup.loop.close()


def test_episodes_are_turns_and_answers_with_the_trainers_log_probs(run):
    setup, args = run
    batch = setup.loop.slots[0]
    setup.generator(batch)
    present, loss = batch.completion_mask, batch.loss_mask
    assert loss.any() and not (loss & ~present).any()
    assert (present & ~loss).any()  # the letters shown between the turns
    assert (batch.log_probs[present & ~loss] == 0).all()
    assert batch.stats["episodes/turns_mean"] == 3  # (three one-token turns fit in 8 tokens)
    expected = trainer_log_probs(setup, args, batch)
    behaviour = batch.log_probs[present]
    sampled = loss[present]
    torch.testing.assert_close(behaviour[sampled], expected[sampled], atol=ATOL, rtol=0)


def test_a_turn_draws_the_same_tokens_whatever_round_it_joins(run):
    setup, _ = run
    runner = setup.generator.episodes.runner
    prompt = runner.tokenize("a=")

    class Slow(Echo):
        def __init__(self, delay):
            self.delay = delay

        def step(self, action):
            time.sleep(self.delay)
            return super().step(action)

    quick = [Episode(Slow(0.0), list(prompt), seed=3) for _ in range(4)]
    runner.run(quick, noise_seed=7)
    staggered = [Episode(Slow(d), list(prompt), seed=3) for d in (0.0, 0.05, 0.0, 0.1)]
    runner.run(staggered, noise_seed=7)
    assert [e.tokens for e in staggered] == [e.tokens for e in quick]
    assert any(e.turns > 1 for e in quick)


def test_failing_environments_end_their_episodes_and_the_run_goes_on(model_dir):
    """tests/agents' failing environments (hung past the timeout, crashing, returning garbage,
    never ending, by seed) with vLLM generating: counted, and the run goes on."""
    args = _args(model_dir, "Faulty", tool_timeout=0.5, steps=3, num_prompts=4, log_interval=1)
    logged = []
    result = grpo.train(args, log=lambda step, values: logged.append(values))
    assert len(result.rewards) == 3
    assert sum(v["episodes/failed"] for v in logged) > 0
    assert sum(v["episodes/truncated"] for v in logged) > 0
