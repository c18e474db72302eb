"""The README's Python examples run as written (each in a fresh folder, as a user would paste
it), and its links point at files that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) <= 200
    first_paragraph = README.split("\n\n")[1]
    assert "language models" in first_paragraph and "PPO" in first_paragraph
    assert "profiler" in first_paragraph
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_python_example_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {})
    assert capsys.readouterr().out.strip()  # each example prints what it shows
    assert any(tmp_path.glob("runs/*/report.json"))


def test_every_link_exists():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_guides_tensorboard_example_writes_scalars(tmp_path, monkeypatch):
    """docs/guide.md's Python block, as written: a run from Python logs to TensorBoard."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/guide.md").read_text(), re.S)
    (block,) = [b for b in blocks if "runs/cartpole" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(block.replace("8192", "2048"), "docs/guide.md python block", "exec"), {})
    (logs,) = (tmp_path / "runs/cartpole/tensorboard").iterdir()
    assert any(
        f.name.startswith("events.out.tfevents") and f.stat().st_size > 0 for f in logs.iterdir()
    )
    assert (tmp_path / "runs/cartpole/report.json").exists()
