"""Multi-turn episodes (nostall/agents): the built-in game's rules, environment calls off the
decoder's thread with their timeouts, a decoder that keeps decoding while an environment is slow,
failures that end their episode and are counted, tokens independent of the round an episode
joins, environment tokens out of the loss, exact resume on the thread and process backends, and
a tiny model that learns the game."""

import dataclasses
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from nostall.agents.env_calls import EnvCalls
from nostall.agents.episodes import Episode, EpisodeRunner, EpisodeSettings
from nostall.agents.text_env import EnvError, GuessNumber, check_step
from nostall.algos import grpo

FAST = dict(
    task="guess", steps=6, num_prompts=2, num_generations=4, watch_syncs=False, log_interval=2
)


def test_guess_number_answers_each_guess_and_pays_for_fewer_turns():
    env = GuessNumber(high=8, max_turns=4)
    assert env.reset(seed=5)[0] == "guess 1-8:"
    secret = env.secret
    other = GuessNumber()
    other.reset(seed=5)
    assert other.secret == secret  # the seed hides the same number
    wrong = 1 if secret != 1 else 2
    assert env.step(str(wrong))[:4] == ("<" if secret < wrong else ">", 0.0, False, False)
    assert env.step("12")[:4] == ("?", 0.0, False, False)
    assert env.step(f" {secret}\n")[:4] == ("=", 1.0 - 2 / 4, True, False)
    env.reset(seed=5)
    for _ in range(4):
        observation, _, terminated, truncated, _ = env.step("x")
    assert (observation, terminated, truncated) == ("?", False, True)
    with pytest.raises(ValueError, match="high"):
        GuessNumber(high=10)


@pytest.mark.parametrize(
    "returned",
    [
        None,
        ("a", 1.0),
        ("a", "x", False, False, {}),
        (1, 0.0, False, False, {}),
        ("a", float("nan"), False, False, {}),
        "obs",
    ],
)
def test_a_step_that_returns_garbage_is_an_env_error(returned):
    with pytest.raises(EnvError):
        check_step(returned)


def test_a_call_past_its_timeout_is_given_up_and_its_late_answer_dropped():
    calls = EnvCalls(timeout_s=0.2)
    release = threading.Event()
    calls.submit(0, lambda: release.wait(5) and "late")
    calls.submit(1, lambda: "quick")
    got = {}
    while calls.pending:
        for f in calls.collect(wait=True):
            got[f.key] = f
    assert got[1].value == "quick" and got[1].error is None
    assert isinstance(got[0].error, TimeoutError)
    release.set()
    time.sleep(0.05)
    assert calls.collect(wait=False) == []  # (the given-up call's answer: dropped)


def _runner(turn_tokens=1, budget=8, max_turns=4, timeout_s=5.0) -> EpisodeRunner:
    """The guess task's runner, over the tiny model's engine, with these budgets."""
    runner = grpo.build(grpo.GRPOCommandConfig(**FAST)).generator.episodes.runner
    eos = runner.settings.eos_token_id
    runner.settings = EpisodeSettings(max_turns, budget, timeout_s, eos, turn_tokens)
    return runner


def _prompt(runner) -> list[int]:
    return runner.tokenize("guess 1-8:")


class Scripted:
    """GuessNumber, whose step may first run `before_step` (a delay, a hang, an error)."""

    def __init__(self, before_step=None, returns=None, endless=False):
        self.game, self.before_step = GuessNumber(), before_step
        self.returns, self.endless = returns, endless

    def reset(self, *, seed=None, options=None):
        return self.game.reset(seed=seed)

    def step(self, action):
        if self.before_step is not None:
            self.before_step()
        if self.returns is not None:
            return self.returns
        observation, reward, terminated, _, info = self.game.step(action)
        if self.endless:
            return ">", 0.0, False, False, info
        return observation, reward, terminated, False, info


def _episodes(runner, envs) -> list[Episode]:
    return [Episode(env, _prompt(runner), seed=3) for env in envs]


def test_the_decoder_keeps_decoding_while_one_environment_is_slow():
    """One environment's first step waits until every other episode has ended: a scheduler
    that waited for it before decoding the others would never get there (the wait times out
    and the test fails)."""
    runner = _runner()
    others_done = threading.Event()
    waited = []
    slow = Scripted(before_step=lambda: waited.append(others_done.wait(10)))
    fast = [Scripted(endless=True) for _ in range(5)]
    episodes = _episodes(runner, [slow, *fast])
    ended = []

    def watch():
        while len(ended) < 5:
            ended[:] = [e for e in episodes[1:] if e.done]
            time.sleep(0.005)
        others_done.set()

    threading.Thread(target=watch, daemon=True).start()
    stats = runner.run(episodes, noise_seed=1)
    assert waited and all(waited)  # (never timed out: the others ended meanwhile)
    assert all(e.turns == 4 for e in episodes[1:])  # every turn taken while the slow one waited
    assert episodes[0].failure is None and stats.rounds >= 4


def test_hung_crashing_garbage_and_endless_environments_end_their_episodes():
    runner = _runner(timeout_s=0.3)

    def crash():
        raise RuntimeError("simulator crashed")

    envs = [
        Scripted(before_step=lambda: time.sleep(3)),  # hung past tool_timeout
        Scripted(before_step=crash),
        Scripted(returns=("fine", 1.0)),  # garbage: not a step's 5-tuple
        Scripted(endless=True),  # never terminates
        Scripted(),
    ]
    episodes = _episodes(runner, envs)
    runner.run(episodes, noise_seed=2)
    hung, crashed, garbage, endless, plain = episodes
    assert "TimeoutError" in hung.failure and "tool_timeout" in hung.failure
    assert "RuntimeError: simulator crashed" in crashed.failure
    assert "not (observation, reward" in garbage.failure
    assert endless.failure is None and endless.truncated and endless.turns == 4
    assert plain.failure is None and plain.done
    assert all(e.done for e in episodes)


def test_an_episode_samples_the_same_tokens_whatever_round_it_joins():
    runner = _runner()
    quick = _episodes(runner, [Scripted() for _ in range(6)])
    runner.run(quick, noise_seed=7)
    delays = [0.0, 0.05, 0.0, 0.02, 0.08, 0.0]
    staggered = _episodes(runner, [Scripted(before_step=lambda d=d: time.sleep(d)) for d in delays])
    stats = runner.run(staggered, noise_seed=7)
    assert [e.tokens for e in staggered] == [e.tokens for e in quick]
    # The log-probs to float32 rounding: a round's width (its rows, its longest context) changes
    # the order of the decode's sums, a few ulps of numbers near 1 (stated: 1e-6).
    for a, b in zip(staggered, quick, strict=True):
        torch.testing.assert_close(a.log_probs, b.log_probs, rtol=1e-6, atol=1e-6)
    assert stats.rounds >= 4


def test_environment_tokens_are_attended_but_out_of_the_loss():
    args = grpo.GRPOCommandConfig(**FAST, staleness=0)
    setup = grpo.build(args)
    grpo.train(args, setup=setup)
    batch = setup.loop.slots[0]
    present, loss = batch.completion_mask, batch.loss_mask
    assert not (loss & ~present).any()
    environment = present & ~loss
    assert environment.any()  # observations ("<", ">", "?") between the turns
    assert (batch.log_probs[environment] == 0).all()
    assert loss.any()


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("k", [2, 4])
def test_resume_from_the_kth_checkpoint_is_exact(tmp_path, backend, k):
    args = grpo.GRPOCommandConfig(
        **dict(FAST, steps=6),
        staleness=0,
        checkpoint=str(tmp_path / "c-{step}.pt"),
        checkpoint_every=2,
    )
    full = grpo.train(args)
    resumed = grpo.train(
        dataclasses.replace(
            args, backend=backend, resume=str(tmp_path / f"c-{k}.pt"), checkpoint=None
        )
    )
    assert resumed.rewards == full.rewards
    assert mp.active_children() == []


def test_environments_in_processes_of_their_own_train_as_in_threads():
    """env_isolation="process" changes where the environment runs, not what it answers: the
    same run's rewards, step for step."""
    args = grpo.GRPOCommandConfig(
        task="guess", steps=3, num_prompts=4, num_generations=2, watch_syncs=False, staleness=0
    )
    threads = grpo.train(args)
    processes = grpo.train(dataclasses.replace(args, env_isolation="process"))
    assert processes.rewards == threads.rewards
    assert len(set(threads.rewards)) > 1  # (episodes that score differently)


def test_the_tiny_model_learns_the_guessing_game():
    args = grpo.GRPOCommandConfig(task="guess", steps=150, seed=5, watch_syncs=False)
    rewards = grpo.train(args).rewards
    first, last = sum(rewards[:20]) / 20, sum(rewards[-30:]) / 30
    assert last > first + 0.05, (first, last)


def test_episode_settings_are_checked_by_name():
    for given, message in [
        (dict(max_turns=0), "--max-turns"),
        (dict(max_turn_tokens=0), "--max-turn-tokens"),
        (dict(tool_timeout=-1.0), "--tool-timeout"),
        (dict(tool_timeout=float("inf")), "--tool-timeout"),
    ]:
        with pytest.raises(ValueError, match=message):
            grpo.GRPOCommandConfig(**FAST, **given).check()


def test_a_users_environment_trains_from_python_and_is_named_in_the_run():
    args = grpo.GRPOCommandConfig(
        **dict(FAST, task="copy"),
        environment="tests.agents.text_envs:make_echo",
        max_turn_tokens=1,
        max_new_tokens=8,
        staleness=0,
    )
    setup = grpo.build(args)
    result = grpo.train(args, setup=setup)
    batch = setup.loop.slots[0]
    assert result.rewards and all(0 <= r <= 3 for r in result.rewards)
    assert (batch.completion_mask & ~batch.loss_mask).any()  # the letters shown, out of the loss


def test_a_users_environment_trains_from_the_command_line(tmp_path):
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "nostall.cli",
        "train",
        "grpo",
        "--environment",
        "tests.agents.text_envs:Echo",
        "--max-turn-tokens",
        "1",
        "--max-new-tokens",
        "8",
        "--steps",
        "2",
        "--num-prompts",
        "2",
        "--num-generations",
        "2",
        "--out",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "model").is_dir()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (dict(environment="nocolon"), "must be given as module:Class"),
        (dict(environment="no_such_module_here:Env"), "cannot import"),
        (dict(environment="tests.agents.text_envs:Missing"), "has no class or function"),
        (dict(environment="tests.agents.text_envs:NOT_CALLABLE"), "has no class or function"),
        (dict(environment="tests.agents.text_envs:NoStep"), "has no step"),
        (
            dict(environment="tests.agents.text_envs:Echo", reward="tests.agents.text_envs:Echo"),
            "leave out --reward",
        ),
        (dict(task="guess", reward="tests.agents.text_envs:make_echo"), "leave out --reward"),
    ],
)
def test_a_bad_environment_is_refused_by_name(given, message):
    with pytest.raises(ValueError, match=message):
        grpo.build(grpo.GRPOCommandConfig(**dict(FAST, **given)))


def test_the_guides_environment_example_trains_from_the_command_line(tmp_path):
    """docs/guide.md's text environment, saved as my_envs.py, and its command (shortened)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "class Echo" in b]
    (tmp_path / "my_envs.py").write_text(block)
    (command,) = [line for line in guide.splitlines() if "--environment my_envs:Echo" in line]
    flags = [*command.split()[3:], "--steps", "2", "--num-prompts", "2", "--out", "run"]
    done = subprocess.run(
        [sys.executable, "-m", "nostall.cli", "train", "grpo", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "model").is_dir()
