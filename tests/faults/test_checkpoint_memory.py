"""Checkpoints are written and read by streaming, and store each weight once: saving adds at
most one tensor to the peak memory, loading (and copying into the model, as a resume does) at
most the state plus one tensor; a GRPO checkpoint holds the weights once where copies agree,
tied embeddings once. (Before: three copies of the state on save and on load, five of the
model in a GRPO checkpoint.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nostall.algos import grpo
from nostall.train import checkpoint

ROOT = Path(__file__).resolve().parent.parent.parent
SLACK_MIB = 24  # the interpreter's own allocations while it saves or loads


def _measure(step: str, path: Path) -> dict:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.checkpoints.memory",
            "--mib",
            "96",
            "--tensors",
            "12",
            "--child",
            step,
            "--path",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_saving_and_loading_hold_the_state_at_most_once(tmp_path):
    path = tmp_path / "c.pt"
    saved = _measure("save", path)
    assert saved["save_peak_added_mib"] <= saved["one_tensor_mib"] + SLACK_MIB, saved
    loaded = _measure("load", path)
    bound = saved["state_mib"] + saved["one_tensor_mib"] + SLACK_MIB
    assert loaded["load_peak_added_mib"] <= bound, (saved, loaded)


def test_equal_weights_are_stored_once_and_shared_on_load(tmp_path):
    """Equal weights (a model's, its published and rollout copies, ties) are one tensor; other
    state (an optimizer's moments, which a loader might keep and update in place) is not
    merged even when equal."""
    a = torch.randn(1000, 100)
    zeros = torch.zeros(1000, 100)
    state = {
        "model": {"w": a, "tied": a},
        "loop": {
            "published_weights": {"w": a.clone()},
            "rollout_weights": {"w": a.clone()},
            "queued": [a.clone(), 7],
        },
        "optimizer": {"exp_avg": zeros, "exp_avg_sq": zeros.clone()},
    }
    checkpoint.save(tmp_path / "c.pt", "x", {}, state)
    size = (tmp_path / "c.pt").stat().st_size
    assert size < 4 * a.numel() * 4 + 64 * 1024  # a once; the queued copy, both moments apart
    _, got = checkpoint.load(tmp_path / "c.pt", "x")
    loop = got["loop"]
    pointers = {
        got["model"]["w"].data_ptr(),
        got["model"]["tied"].data_ptr(),
        loop["published_weights"]["w"].data_ptr(),
        loop["rollout_weights"]["w"].data_ptr(),
    }
    assert len(pointers) == 1 and torch.equal(loop["published_weights"]["w"], a)
    assert loop["queued"][0].data_ptr() not in pointers and loop["queued"][1] == 7
    moments = got["optimizer"]
    assert moments["exp_avg"].data_ptr() != moments["exp_avg_sq"].data_ptr()


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_grpo_checkpoint_holds_each_weight_once(tmp_path, staleness):
    """The trainer's weights, the published copy and (when it holds the same version) the
    rollout side's are one copy in the file; Adam's two moments are two more; ties kept."""
    args = grpo.GRPOCommandConfig(
        steps=2,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        staleness=staleness,
        checkpoint=str(tmp_path / "g.pt"),
    )
    trainer = grpo.GRPOTrainer(args=args)
    trainer.train()
    weights = {
        p.data_ptr(): p.numel() * p.element_size() for p in trainer.model.state_dict().values()
    }
    model_bytes = sum(weights.values())
    _, state = checkpoint.load(args.checkpoint, "grpo")
    model = state["model"]
    assert model["lm_head.weight"].data_ptr() == model["model.embed_tokens.weight"].data_ptr()
    published = state["loop"]["published_weights"]
    large = [k for k, v in model.items() if v.numel() * v.element_size() >= 1024]  # (hashed)
    assert large and all(published[k].data_ptr() == model[k].data_ptr() for k in large)
    size = Path(args.checkpoint).stat().st_size
    assert size <= 4 * model_bytes + (1 << 20), size / model_bytes  # weights, 2 moments, rollout
