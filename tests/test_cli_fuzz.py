"""Every flag of `nostall train ppo|appo|grpo`, fuzzed with hypothesis (types, ranges, NaN,
inf, huge, garbage): either the run would start, or the command exits 2 with a message naming
the flag. Never a traceback. (Training itself is replaced by a sentinel: only the checking of
arguments runs.)"""

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nostall import cli
from nostall.algos import appo, grpo, ppo
from nostall.algos.grpo import trainer as grpo_trainer
from nostall.algos.ppo import trainer as ppo_trainer
from nostall.envs.backends import make_env

CONFIGS = {"ppo": ppo.PPOConfig, "appo": appo.APPOConfig, "grpo": grpo.GRPOCommandConfig}


class _Started(Exception):
    pass


def _refuse_to_train(*args, **kwargs):
    raise _Started


VALUES = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "-1",
            "0",
            "1",
            "2",
            "1e5",
            "1e30",
            "-1e30",
            "0.5",
            "abc",
            "",
            "1e-320",
            "9" * 40,
            "cuda",
            "thread",
            "0x10",
        ]
    ),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def _flags(config: type) -> list[str]:
    """The flags that take a value (booleans are --x / --no-x); paths have their own tests."""
    skip = {"checkpoint", "resume", "dataset", "reward", "model", "output_dir"}
    return [
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(config)
        if f.name not in skip and f.type not in (bool, "bool", "bool | None")
    ]


def _check_env_then_refuse(args):
    """The environment is checked as the trainer would (an unknown id, an unsupported space)."""
    make_env(args.env_id, 1, backend=args.env_backend, frame_stack=args.frame_stack).close()
    raise _Started


@pytest.mark.parametrize("algo", ["ppo", "appo", "grpo"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_every_flag_is_checked(algo, data, monkeypatch, capsys):
    # The trainers check every argument before they build the run; building is refused.
    monkeypatch.setattr(ppo_trainer, "make_run_env", _check_env_then_refuse)
    monkeypatch.setattr(
        grpo_trainer, "build", lambda args, inputs=None: (args.check(), _refuse_to_train())
    )
    flag = data.draw(st.sampled_from(_flags(CONFIGS[algo])))
    value = data.draw(VALUES)
    argv = ["train", algo, "--no-progress", flag, value]
    if algo != "grpo":
        argv += ["--total-timesteps", "1024"] if flag != "--total-timesteps" else []
    try:
        code = cli.main(argv)
    except _Started:
        return  # valid: the run would have started
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (flag, value, err)
    assert "Traceback" not in err
    name = flag[2:].replace("-", "_")
    assert re.search(f"{flag}|{name}|num_envs \\* num_steps|minibatch|batch", err), (
        flag,
        value,
        err,
    )


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_setting_that_names_the_output_folder_is_checked_before_the_folder(
    algo, tmp_path, monkeypatch, capsys
):
    """The default folder is made of settings (the seed): a huge one is named as the bad
    setting, never met as a path too long for the file system. (Found by the fuzz above.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # (a folder of earlier runs: the name would be looked up there)
    assert cli.main(["train", algo, "--no-progress", "--seed", "1e+240"]) == 2
    assert "seed" in capsys.readouterr().err and not any((tmp_path / "runs").iterdir())
