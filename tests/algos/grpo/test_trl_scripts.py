"""Scripts written for TRL's GRPOTrainer, in the shapes of TRL's documentation, run under nostall
with only the import line changed: the quickstart, conversational prompts with two weighted
rewards, a loaded model and tokenizer with a peft_config and a callback, an eval_dataset
evaluated during training and by evaluate(), a reward model beside a function, and epochs with
checkpoint folders and resume_from_checkpoint=True. Where TRL is installed each script also
runs under TRL, and the two runs must agree on what TRL's semantics fix: the optimizer steps,
the epochs, the checkpoint folders and the figures logged under TRL's names."""

import importlib.util
import textwrap

import pytest

from tests.lm import architectures

HAS_TRL = importlib.util.find_spec("trl") is not None
LIBRARIES = ["nostall", pytest.param("trl", marks=pytest.mark.skipif(not HAS_TRL, reason="TRL"))]

# The figures both log every logging_steps (docs/from_trl.md lists nostall's own besides).
SHARED_KEYS = {
    "grad_norm",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "num_tokens",
    "step_time",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "loss",
    "learning_rate",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "epoch",
    "step",
}

SUMMARY_KEYS = {
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "epoch",
    "step",
}

EVAL_KEYS = {
    "eval_reward",
    "eval_reward_std",
    "eval_rewards/reward_len/mean",
    "eval_completions/mean_length",
}

COMMON = """
from datasets import Dataset
from {lib} import GRPOConfig, GRPOTrainer

rows = [{{"prompt": "ab" * (i % 3 + 1)}} for i in range(12)]

def reward_len(completions, **kwargs):
    return [-abs(4 - len(c)) for c in completions]
"""

SCRIPTS = {
    "quickstart": """
args = GRPOConfig(output_dir=OUT, max_steps=4, logging_steps=1, max_completion_length=6,
                  per_device_train_batch_size=4, num_generations=4, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=args,
                      train_dataset=Dataset.from_list(rows))
trainer.train()
""",
    "conversational": """
chats = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]

def reward_a(completions, **kwargs):
    return [float(c[0]["content"].count("a")) for c in completions]

args = GRPOConfig(output_dir=OUT, max_steps=3, logging_steps=1, max_completion_length=6,
                  num_generations=4, per_device_train_batch_size=8, reward_weights=[1.0, 0.5],
                  use_cpu=True)
trainer = GRPOTrainer(model=MODEL, reward_funcs=[reward_len, reward_a], args=args,
                      train_dataset=Dataset.from_list(chats))
trainer.train()
""",
    "peft_and_callback": """
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

events = []

class Recorder(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        events.append(("step", state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        events.append(("log", state.global_step))

model = AutoModelForCausalLM.from_pretrained(MODEL)
tokenizer = AutoTokenizer.from_pretrained(MODEL)
args = GRPOConfig(output_dir=OUT, max_steps=4, logging_steps=2, max_completion_length=6,
                  num_generations=4, per_device_train_batch_size=4, learning_rate=1e-3,
                  use_cpu=True)
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_len,
                      args=args, train_dataset=Dataset.from_list(rows), callbacks=[Recorder()],
                      peft_config=lora)
trainer.train()
""",
    "eval_dataset": """
args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=6,
                  num_generations=4, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  eval_strategy="steps", eval_steps=1, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=args,
                      train_dataset=Dataset.from_list(rows),
                      eval_dataset=Dataset.from_list(rows[:4]))
trainer.train()
metrics = trainer.evaluate()
""",
    "reward_model": """
args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=6,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, reward_funcs=[REWARD_MODEL, reward_len], args=args,
                      train_dataset=Dataset.from_list(rows))
trainer.train()
""",
    "optimizers": """
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(MODEL)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.8, 0.99), weight_decay=0.1)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
args = GRPOConfig(output_dir=OUT, max_steps=3, logging_steps=1, max_completion_length=6,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True)
trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=args,
                      train_dataset=Dataset.from_list(rows), optimizers=(optimizer, schedule))
trainer.train()
""",
    "epochs_and_resume": """
def run(epochs, resume):
    args = GRPOConfig(output_dir=OUT, num_train_epochs=epochs, save_steps=2, logging_steps=1,
                      max_completion_length=6, num_generations=4,
                      per_device_train_batch_size=8, use_cpu=True)
    trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=args,
                          train_dataset=Dataset.from_list(rows))
    trainer.train(resume_from_checkpoint=resume)
    return trainer

first = run(1, None)
trainer = run(2, True)
""",
}

# (global steps, epoch, checkpoint folders) each script ends with, as TRL counts them.
EXPECTED = {
    "quickstart": (4, 4 / 12, ["checkpoint-4"]),
    "conversational": (3, 3 / 6, ["checkpoint-3"]),  # (2 prompts a batch)
    "peft_and_callback": (4, 4 / 12, ["checkpoint-4"]),
    "eval_dataset": (2, 2 / 12, ["checkpoint-2"]),
    "reward_model": (2, 2 / 12, ["checkpoint-2"]),
    "optimizers": (3, 3 / 12, ["checkpoint-3"]),
    # 12 prompts, 2 a batch: 6 steps an epoch; folders every 2 steps and at each run's end
    "epochs_and_resume": (12, 2.0, [f"checkpoint-{n}" for n in (2, 4, 6, 8, 10, 12)]),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    architectures.save("qwen2", folder)
    # A chat template, for the conversational script (the test tokenizer has none).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '' }}{% endif %}"
    )
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A sequence-classification model of one label over the same tokenizer, saved."""
    from tests.lm.test_reward_models import reward_model

    folder = tmp_path_factory.mktemp("reward_model")
    model, tokenizer = reward_model(seed=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_script(name: str, lib: str, model_dir, out, reward_model_dir=None) -> dict:
    namespace = {"OUT": str(out), "MODEL": str(model_dir), "REWARD_MODEL": str(reward_model_dir)}
    text = textwrap.dedent(COMMON).format(lib=lib) + textwrap.dedent(SCRIPTS[name])
    exec(compile(text, f"<{name} under {lib}>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("lib", LIBRARIES)
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_trl_script_runs_with_trls_semantics(name, lib, model_dir, reward_model_dir, tmp_path):
    out = tmp_path / "out"
    namespace = run_script(name, lib, model_dir, out, reward_model_dir)
    trainer = namespace["trainer"]
    steps, epoch, folders = EXPECTED[name]
    state = trainer.state
    assert state.global_step == steps
    assert state.epoch == pytest.approx(epoch)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(folders)
    logs = [entry for entry in state.log_history if "loss" in entry]
    assert logs and all(SHARED_KEYS <= set(entry) for entry in logs), logs[-1]
    assert any(SUMMARY_KEYS <= set(entry) for entry in state.log_history)  # the run's end
    tokens = [entry["num_tokens"] for entry in logs]
    assert tokens == sorted(tokens) and tokens[0] > 0  # cumulative
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / folders[-1])  # (a model directory)
    if "metrics" in namespace:  # evaluate(), and eval_strategy's evaluations in the log
        assert EVAL_KEYS <= set(namespace["metrics"]), namespace["metrics"]
        evaluated = [e["step"] for e in state.log_history if "eval_reward" in e]
        assert evaluated == [1, 2, 2]


def test_a_callback_sees_every_step_and_log_and_the_adapters_train(model_dir, tmp_path):
    namespace = run_script("peft_and_callback", "nostall", model_dir, tmp_path / "out")
    steps = [n for kind, n in namespace["events"] if kind == "step"]
    logs = [n for kind, n in namespace["events"] if kind == "log"]
    assert steps == [1, 2, 3, 4] and logs == [2, 4]
    assert namespace["trainer"].config.lora_r == 4
    assert namespace["trainer"].config.lora_target_modules == "q_proj,v_proj"


def test_a_users_optimizer_and_scheduler_set_the_runs_settings_and_rates(model_dir, tmp_path):
    """optimizers=(AdamW, LambdaLR): the AdamW's settings are the run's, and each step trains
    at the rate the scheduler gives at the step's first optimizer step."""
    namespace = run_script("optimizers", "nostall", model_dir, tmp_path / "out")
    config = namespace["trainer"].config
    assert (config.learning_rate, config.adam_beta1, config.adam_beta2) == (2e-3, 0.8, 0.99)
    assert config.weight_decay == 0.1
    rates = [e["learning_rate"] for e in namespace["trainer"].state.log_history if "loss" in e]
    assert rates == pytest.approx([2e-3 / (1 + s) for s in range(3)])


def test_a_callback_stops_the_run(model_dir, tmp_path):
    from transformers import TrainerCallback

    from nostall import GRPOConfig, GRPOTrainer

    class StopAtTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= 2

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        max_completion_length=4,
        num_generations=4,
        per_device_train_batch_size=4,
        save_strategy="no",
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        train_dataset=[{"prompt": "ab"}] * 8,
        callbacks=[StopAtTwo],
    )
    trainer.train()
    assert trainer.state.global_step == 2


def test_resume_from_checkpoint_true_continues_the_first_run_exactly(model_dir, tmp_path):
    """Two epochs in one run, and one epoch then a resumed second: the same rewards."""
    whole = run_script("epochs_and_resume", "nostall", model_dir, tmp_path / "a")
    namespace = {"OUT": str(tmp_path / "b"), "MODEL": str(model_dir)}
    text = textwrap.dedent(COMMON).format(lib="nostall") + textwrap.dedent(
        SCRIPTS["epochs_and_resume"]
    ).replace("first = run(1, None)\ntrainer = run(2, True)", "trainer = run(2, None)")
    exec(compile(text, "<two epochs at once>", "exec"), namespace)
    assert whole["trainer"].result.rewards == namespace["trainer"].result.rewards

    # The log lines of the steps before the resume come back from the checkpoint (each step's
    # line is in its checkpoint, as TRL logs before it saves).
    def logged(trainer):
        return [e["step"] for e in trainer.state.log_history if "loss" in e]

    assert logged(whole["trainer"]) == logged(namespace["trainer"])


def test_a_second_run_never_writes_over_the_first_runs_checkpoint_folders(model_dir, tmp_path):
    """TRL would overwrite checkpoint-N; nostall refuses before writing anything, and a resume
    (the same lineage) goes on."""
    run_script("quickstart", "nostall", model_dir, tmp_path / "out")
    before = (tmp_path / "out" / "checkpoint-4" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="holds another run's checkpoint folders"):
        run_script("quickstart", "nostall", model_dir, tmp_path / "out")
    assert (tmp_path / "out" / "checkpoint-4" / "model.safetensors").read_bytes() == before


def test_save_total_limit_keeps_this_runs_newest_folders_and_touches_nothing_else(tmp_path):
    from nostall.algos.grpo.trl_surface import STATE_FILE, prune_folders

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere" / "checkpoint-1"
    for folder in (out / "checkpoint-1", out / "checkpoint-2", out / "checkpoint-3", elsewhere):
        folder.mkdir(parents=True)
        (folder / STATE_FILE).write_bytes(b"")
    written = [str(elsewhere / STATE_FILE)]  # (a lineage naming a folder of another place)
    written += [str(out / f"checkpoint-{n}" / STATE_FILE) for n in (1, 2, 3)]
    kept = prune_folders(written, 2, str(out))
    assert kept == written[-2:]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert elsewhere.is_dir()  # not this run's output_dir: never removed
