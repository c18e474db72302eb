"""TRL's GRPOTrainer on nostall's tiny model, tokenizer, task and reward, configured as its
documentation sets it up (GRPOConfig), for benchmarks/lm/bench_grpo.py.

    python -m benchmarks.lm.trl_grpo --seed 1 --max-steps 400 --target 0.7

Prints one JSON line: per-step wall time (from the start of training) and mean reward, as
TRL logs them at logging_steps=1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
import warnings

import torch


def run(
    seed: int,
    max_steps: int,
    target: float,
    time_limit_s: float,
    prompts: int = 8,
    generations: int = 8,
    max_new_tokens: int = 5,
    lr: float = 2e-3,
) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nostall.lm.models import builtin_model
    from nostall.lm.tasks import TASKS, answer_reward

    torch.set_num_threads(1)
    lm = builtin_model("tiny", seed=seed)
    import random

    rng = random.Random(seed)
    rows = [
        dict(zip(("prompt", "answer"), TASKS["copy"](rng), strict=True))
        for _ in range(prompts * (max_steps + 1))
    ]
    record: dict = {"times": [], "rewards": []}

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            record["start"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                record["times"].append(time.perf_counter() - record["start"])
                record["rewards"].append(float(logs["reward"]))
                recent = record["rewards"][-10:]
                elapsed = record["times"][-1]
                if (len(recent) == 10 and sum(recent) / 10 >= target) or elapsed > time_limit_s:
                    control.should_training_stop = True

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=prompts * generations,
            num_generations=generations,
            max_completion_length=max_new_tokens,
            temperature=1.0,
            learning_rate=lr,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            epsilon=0.2,
            beta=0.0,
            loss_type="dapo",
            num_iterations=1,
            max_steps=max_steps,
            seed=seed,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=lm.model,
                reward_funcs=answer_reward,
                args=config,
                train_dataset=Dataset.from_list(rows),
                processing_class=lm.tokenizer,
                callbacks=[Recorder()],
            )
            with contextlib.redirect_stdout(io.StringIO()):  # its per-step log lines
                trainer.train()
    return {"times": record["times"], "rewards": record["rewards"]}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--target", type=float, default=0.7)
    p.add_argument("--time-limit", type=float, default=60.0)
    a = p.parse_args()
    print(json.dumps(run(a.seed, a.max_steps, a.target, a.time_limit)))
