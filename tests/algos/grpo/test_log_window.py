"""Logged figures are means over the logging window, as TRL logs them: a log line every 3 steps
says the mean of what a log line every step says over those 3 steps (the same run: logging
reads figures, it does not change training), grad_norm the logged step's; a checkpoint between
two log lines holds the open window, so the resumed run's next line is the uninterrupted one's.
The runs are short and their steps many (a window is one sum a figure, whatever the run's
length: tested on the class)."""

import math

import pytest
import torch

from nostall import GRPOConfig, GRPOTrainer
from nostall.lm.tasks import answer_reward
from nostall.train.log_window import LogWindow
from tests.algos.grpo.test_evaluation import stop_after

# Figures of the run's progress, not of a window of steps: step_time, the clock's.
NOT_MEANS = {"grad_norm", "learning_rate", "step_time", "tokens_per_second", "num_tokens"}
NOT_MEANS |= {"version_lag", "epoch", "step"}


def test_the_window_averages_each_figure_over_the_steps_that_measured_it():
    window = LogWindow(last_only=("grad_norm",))
    window.add({"loss": torch.tensor(1.0), "grad_norm": torch.tensor(5.0), "kl": 0.5})
    window.add({"loss": torch.tensor(3.0), "grad_norm": torch.tensor(7.0)})
    window.add({"loss": torch.tensor(8.0), "entropy": torch.tensor(2.0)})
    means = {k: float(v) for k, v in window.means().items()}
    assert means == {"loss": 4.0, "grad_norm": 7.0, "kl": 0.5, "entropy": 2.0}
    assert window.means() == {}  # emptied at each log line


def test_the_window_keeps_a_copy_of_a_figure_its_producer_writes_over():
    window, buffer = LogWindow(), torch.tensor([2.0])
    window.add({"loss": buffer[0]})
    buffer.fill_(100.0)  # (a figure's buffer reused by the next step)
    window.add({"loss": buffer[0]})
    assert float(window.means()["loss"]) == 51.0


def test_a_long_run_of_short_steps_keeps_one_sum_a_figure():
    window = LogWindow()
    for step in range(1, 10_001):
        window.add({"loss": torch.tensor(float(step)), "kl": 1.0})
        assert len(window._sums) == 2
        if step % 1000 == 0:
            assert float(window.means()["loss"]) == step - 499.5


def test_an_open_window_is_carried_through_its_state():
    window = LogWindow()
    window.add({"loss": torch.tensor(1.0)})
    resumed = LogWindow()
    resumed.load_state_dict(window.state_dict())
    resumed.add({"loss": torch.tensor(2.0)})
    assert float(resumed.means()["loss"]) == 1.5


def length(completions, **kwargs):
    """A reward every group spreads (the loss is 0 where a group's rewards are equal)."""
    return [float(len(c)) for c in completions]


def _trainer(tmp_path, logging_steps: int, steps: int = 6, callbacks=None, **extra):
    args = GRPOConfig(
        **{"save_strategy": "no", **extra},
        model="tiny",
        max_steps=steps,
        logging_steps=logging_steps,
        per_device_train_batch_size=8,
        num_generations=4,
        watch_syncs=False,
        output_dir=str(tmp_path),
    )
    rewards = [answer_reward, length]
    return GRPOTrainer(model="tiny", reward_funcs=rewards, args=args, callbacks=callbacks)


def _lines(trainer) -> dict[int, dict]:
    return {e["step"]: e for e in trainer.state.log_history if "loss" in e}


@pytest.mark.parametrize("measure_every_step", [True, False])
def test_a_log_line_says_the_mean_of_the_window_of_steps_it_ends(tmp_path, measure_every_step):
    """Every step logged (the reference) against every third: the third's line holds the mean
    of the three lines. Tolerance: the window adds three float32 figures in float64, the
    reference's mean adds the same three float32 values in float64: equal to rounding."""
    each = _trainer(tmp_path / "each", 1)
    each.train()
    every_third = _trainer(tmp_path / "third", 3, measure_every_step=measure_every_step)
    every_third.train()
    reference, windowed = _lines(each), _lines(every_third)
    assert sorted(windowed) == [3, 6]
    averaged = 0
    for end, line in windowed.items():
        steps = [reference[s] for s in range(end - 2, end + 1)]
        assert line["grad_norm"] == pytest.approx(steps[-1]["grad_norm"], rel=1e-9)
        for name, value in line.items():
            if name in NOT_MEANS or not isinstance(value, float):
                continue
            # Without measure_every_step, the figures measured on their own pass (the
            # entropy, the clip ratios) are the logged step's alone.
            measured_alone = name == "entropy" or name.startswith("clip_ratio/")
            expected = [s[name] for s in steps]
            if measured_alone and not measure_every_step:
                expected = expected[-1:]
            mean = math.fsum(expected) / len(expected)
            assert value == pytest.approx(mean, rel=1e-9, abs=1e-12), (end, name)
            averaged += 1
    assert averaged >= 2 * 20  # (loss, reward, kl, entropy, clip ratios, sampling, lengths...)
    # And the figures move from step to step: a window's mean is not any one step's.
    losses = [reference[s]["loss"] for s in (4, 5, 6)]
    assert len(set(losses)) == 3


def test_a_resumed_run_logs_the_window_its_checkpoint_left_open(tmp_path):
    """A checkpoint at step 4, a log line every 3: the window of steps 4-6 is open at the
    checkpoint; the run stopped there and resumed logs at step 6 what the uninterrupted run
    does (exact resume: the same steps, so the same figures, to float32 rounding)."""
    saving = dict(save_strategy="steps", save_steps=4)
    whole = _trainer(tmp_path / "whole", 3, **saving)
    whole.train()
    stopped = _trainer(tmp_path / "resumed", 3, callbacks=[stop_after(4)], **saving)
    stopped.train()
    assert stopped.state.global_step == 4 and 6 not in _lines(stopped)
    resumed = _trainer(tmp_path / "resumed", 3, **saving)
    resumed.train(resume_from_checkpoint=True)
    expected, got = _lines(whole)[6], _lines(resumed)[6]
    compared = 0
    for name, value in expected.items():
        if name in NOT_MEANS - {"grad_norm"} or not isinstance(value, float):
            continue
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
        compared += 1
    assert compared >= 20
