"""A sequence-classification model as a reward function, as TRL's GRPOTrainer takes one: each
prompt and completion joined (text concatenated; a conversation rendered whole by the reward
model's chat template), tokenized by the reward model's tokenizer without special tokens, padded
on the right, and scored by the model's first logit. Given as a model object (with its tokenizer
from `reward_processing_classes`, or found beside it), a directory, or a Hub id already in the
local Hugging Face cache."""

from __future__ import annotations

from pathlib import Path

import torch


def names_a_model(spec: str) -> bool:
    """Whether a reward given as a string is a model (a directory, or a Hub id: no ':'), not a
    `module:function`."""
    return Path(spec).is_dir() or ":" not in spec


class RewardModel:
    """Scores completions with a sequence-classification model (TRL's reward models)."""

    def __init__(self, model: torch.nn.Module, tokenizer, name: str | None = None):
        if not hasattr(model, "config") or not callable(model):
            raise ValueError(
                f"reward_funcs: {type(model).__name__} is not a transformers model (give a "
                "sequence-classification model, its directory, or a function)"
            )
        if tokenizer is None:
            raise ValueError(
                f"reward_funcs: the reward model {name or type(model).__name__} needs its "
                "tokenizer (reward_processing_classes, or saved beside the model)"
            )
        if tokenizer.pad_token is None:  # (TRL's: pad with <eos>)
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer = model.eval(), tokenizer
        path = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.__name__ = str(path).rstrip("/").split("/")[-1]  # (the metrics' name, as TRL's)

    @classmethod
    def load(cls, spec: str) -> RewardModel:
        """A directory or cached Hub id, loaded as TRL loads one (one label); ValueError with
        the reason where it holds no sequence-classification model."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from nostall.lm.models import cached_snapshot

        path = Path(spec) if Path(spec).is_dir() else cached_snapshot(spec)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, local_files_only=True
            )
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"reward model {spec!r}: cannot load it ({e})") from None
        return cls(model, tokenizer, spec)

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        if prompts and not isinstance(prompts[0], str):  # conversations
            texts = [
                self.tokenizer.apply_chat_template(p + c, tokenize=False)
                for p, c in zip(prompts, completions, strict=True)
            ]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=False,
        )
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            scores = self.model(**inputs.to(device)).logits[:, 0]
        return scores.float().tolist()  # sync: rewards are host values, read once a batch
