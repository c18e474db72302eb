"""Where `--model` / `model=` finds a model: a built-in, a local directory, or a Hub id already
in the local Hugging Face cache (never downloaded)."""

import pytest
import torch
from huggingface_hub import constants

from nostall.lm.models import builtin_model, load_model


def _cache_with(tmp_path, repo_id: str):
    """A Hugging Face hub cache holding `repo_id` as the Hub client lays it out."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    lm = builtin_model("tiny", seed=3)
    lm.model.save_pretrained(snapshot)
    lm.tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return cache, lm


def test_a_hub_id_in_the_local_cache_loads_without_a_download(tmp_path, monkeypatch):
    cache, saved = _cache_with(tmp_path, "someone/tiny-copy")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (a download attempt would fail, not hang)
    lm = load_model("someone/tiny-copy")
    for name, value in saved.model.state_dict().items():
        assert torch.equal(lm.model.state_dict()[name], value), name
    assert lm.tokenizer("abc").input_ids == saved.tokenizer("abc").input_ids


def test_a_hub_id_not_in_the_cache_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(
        ValueError,
        match=r"nor a Hub id in the local Hugging Face cache .*"
        r"`hf download someone/absent`",
    ):
        load_model("someone/absent")
