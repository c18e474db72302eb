"""Code the user names is found in the working directory, and nothing there stands in for an
installed module: a stray `tensorboard.py` beside a run does not replace TensorBoard (or any
later import) in the `nostall` process or its children."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nostall.user_code import import_user_module, working_directory_last

NOSTALL = Path(sys.executable).with_name("nostall")

PLANTED = """from pathlib import Path
Path(__file__).with_name("planted-ran").write_text("ran")
raise SystemExit("a stray module in the working directory was imported")
"""


@pytest.mark.parametrize("command", [[str(NOSTALL)], [sys.executable, "-m", "nostall"]])
def test_a_stray_module_in_the_working_directory_shadows_nothing(tmp_path, command):
    (tmp_path / "tensorboard.py").write_text(PLANTED)
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(prompts, completions, **kwargs):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [
            *command,
            "train",
            "grpo",
            "--model",
            "tiny",
            "--task",
            "copy",
            "--steps",
            "2",
            "--reward",
            "my_rewards:brevity",
            "--backend",
            "process",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (tmp_path / "planted-ran").exists()
    assert "brevity" in (tmp_path / "run" / "report.txt").read_text()  # found in the directory
    assert list((tmp_path / "run" / "tensorboard").iterdir())  # the real TensorBoard wrote


def test_the_working_directory_goes_last_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), "", *sys.path])
    (tmp_path / "only_here.py").write_text("VALUE = 7\n")
    working_directory_last()
    assert sys.path[-1] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    assert "" not in sys.path
    assert import_user_module("only_here").VALUE == 7
    sys.modules.pop("only_here")
