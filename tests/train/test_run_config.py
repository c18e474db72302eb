"""Every run's settings are declared once (RunConfig) and checked once: PPO's and GRPO's configs
inherit them, each bad value is refused by both, named as each config's users write it (PPO by
field, GRPO by flag), and the command lists an algorithm's own flags before every run's."""

import dataclasses
import subprocess
import sys

import pytest

from nostall.algos.appo import APPOConfig
from nostall.algos.grpo import GRPOCommandConfig, GRPOConfig
from nostall.algos.ppo import PPOConfig
from nostall.train.run_config import RunConfig

SHARED = [f.name for f in dataclasses.fields(RunConfig)]
# GRPOConfig is TRL's: a shared setting TRL defaults otherwise takes TRL's default (declared again
# for that alone; the command's config puts nostall's back).
TRL_DEFAULTS = {GRPOConfig: {"seed": 42, "output_dir": "trainer_output"}}

BAD = [  # (setting, value, what the message says after its name)
    ("log_interval", 0, " must be at least 1, got 0"),
    ("checkpoint_every", -3, " must be at least 1, got -3"),
    ("torch_threads", 4096, " must be at most 1024, got 4096"),
    ("num_workers", 0, " must be at least 1, got 0"),
    ("num_workers", 2, " > 1 needs --backend ray"),
    ("trainers", 2, " > 1 needs --backend ray"),
    ("seed", -1, " must be >= 0, got -1"),
    ("seed", 1 << 62, f" must be at most {(1 << 62) - 1}"),
    ("backend", "gpu", " must be thread, process or ray, got 'gpu'"),
    ("ray_weights", "post", " must be store or collective, got 'post'"),
    ("device", "tpu", " must be cpu, cuda or cuda:N, got 'tpu'"),
]


@pytest.mark.parametrize("config", [PPOConfig, APPOConfig, GRPOConfig, GRPOCommandConfig])
def test_every_run_setting_is_declared_once_in_the_run_config(config):
    assert issubclass(config, RunConfig)
    names = [f.name for f in dataclasses.fields(config)]
    assert set(SHARED) <= set(names)
    # None declared again below RunConfig but TRL's seed: its docstring is the one place.
    for klass in config.__mro__[: config.__mro__.index(RunConfig)]:
        assert set(SHARED) & set(vars(klass).get("__annotations__", {})) <= {"seed"}, klass
    expected = {n: getattr(RunConfig(), n) for n in SHARED} | TRL_DEFAULTS.get(config, {})
    assert {n: getattr(config(), n) for n in SHARED} == expected


@pytest.mark.parametrize(("name", "value", "says"), BAD)
@pytest.mark.parametrize(
    ("config", "named"),
    [
        (PPOConfig, lambda name: name),
        (GRPOConfig, lambda name: "--" + name.replace("_", "-")),
    ],
)
def test_each_bad_run_setting_is_refused_by_every_config_naming_it(
    config, named, name, value, says
):
    with pytest.raises(ValueError) as refused:
        config(**{name: value}).check()
    assert named(name) + says in str(refused.value)


@pytest.mark.parametrize(("config", "step"), [(PPOConfig, "iteration"), (GRPOConfig, "step")])
def test_a_checkpoint_path_takes_its_algorithms_step_name(config, step):
    config(checkpoint=f"c-{{{step}}}.pt").check()
    with pytest.raises(ValueError, match=f"the only placeholder is {{{step}}}"):
        config(checkpoint="c-{epoch}.pt").check()


@pytest.mark.parametrize(
    ("algorithm", "own", "heading"),
    [
        ("ppo", "--env-id", "The settings every run has:"),
        ("grpo", "--model", "The settings every run has:"),
        ("appo", "--env-id", "A PPO run's settings:"),
    ],
)
def test_the_command_lists_an_algorithms_own_flags_before_every_runs(algorithm, own, heading):
    text = subprocess.run(
        [sys.executable, "-m", "nostall.cli", "train", algorithm, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert heading in text
    flags = text[text.index("options:") :]  # (past the usage line)
    assert flags.index(own) < flags.index(heading) < flags.index("--checkpoint-every")
