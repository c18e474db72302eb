"""Every field of TRL's GRPOConfig (its own and transformers' TrainingArguments under it) is
accepted by nostall's GRPOConfig, with TRL's default, or refused by name with what to use
instead; TRL's names keep TRL's defaults; docs/from_trl.md lists every field. Walked from TRL's
own dataclass where TRL is installed."""

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from nostall.algos.grpo import GRPOCommandConfig, GRPOConfig, trl_names

ROOT = Path(__file__).resolve().parents[3]
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL not installed")


def trl_fields() -> dict:
    from trl import GRPOConfig as TRLConfig

    fields = {}
    for f in dataclasses.fields(TRLConfig):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = f.default_factory()
    return fields


@needs_trl
def test_every_trl_field_is_known_and_takes_trls_default():
    own = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = [name for name in trl_fields() if name not in own | trl_names.OUTSIDE_NAMES]
    assert not unknown
    for name, default in trl_fields().items():
        config = GRPOConfig(**{name: default})  # accepted at TRL's default
        if name in trl_names.OUTSIDE_NAMES:
            assert getattr(config, name) == default, name  # and read back as set


@needs_trl
def test_trls_defaults_are_nostalls_where_the_field_is_a_setting_here():
    """A field nostall honours starts at TRL's default (None where nostall resolves it later:
    the batch, the model-dependent settings, the length)."""
    config, defaults = GRPOConfig(), trl_fields()
    resolved_later = {"max_completion_length", "epsilon", "num_iterations", "logging_steps"}
    resolved_later |= {"vllm_importance_sampling_correction", "epsilon_high"}
    resolved_later |= {"vllm_importance_sampling_clip_max"}  # (is_cap's TRL name)
    for f in dataclasses.fields(GRPOConfig):
        if f.name in defaults and f.name not in resolved_later:
            ours, theirs = getattr(config, f.name), defaults[f.name]
            if f.name in ("learning_rate", "gradient_checkpointing", "output_dir"):
                continue  # (below: a real model's, and TRL's output folder)
            if f.name == "min_p":
                assert ours == 0.0 and theirs is None  # (None and 0: no filter, both)
                continue
            if f.name == "per_device_train_batch_size":
                assert ours == theirs == 8
                continue
            assert ours == theirs, (f.name, ours, theirs)
    real = GRPOConfig(model="some/model-dir")
    assert real.learning_rate == defaults["learning_rate"]
    assert real.max_new_tokens == defaults["max_completion_length"]
    assert real.gradient_checkpointing is defaults["gradient_checkpointing"] is True
    assert config.log_interval == defaults["logging_steps"]
    assert config.clip_low == defaults["epsilon"] and config.updates_per_batch == 1
    assert config.is_cap == defaults["vllm_importance_sampling_clip_max"] == 3.0


@pytest.mark.parametrize(
    ("name", "value", "instead"),
    [
        ("deepspeed", "ds.json", "trainers=N"),
        ("push_to_hub", True, "upload_folder"),
        ("torch_compile", True, "fused native ops"),
        ("importance_sampling_level", "sequence", "importance_sampling_level='token'"),
        ("vllm_mode", "server", "colocate"),
    ],
)
def test_a_trl_field_nostall_cannot_honour_is_refused_by_name(name, value, instead):
    with pytest.raises(ValueError, match=rf"{name}={value!r} is TRL's.*{instead}"):
        GRPOConfig(**{name: value})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"fp16": True}, "--fp16: nostall computes in bfloat16 or float32"),
        ({"optim": "sgd"}, "--optim 'sgd'"),
        ({"report_to": "neptune"}, "--report-to 'neptune': nostall reports to"),
        ({"save_strategy": "best"}, "--save-strategy must be steps, epoch or no"),
        ({"eval_strategy": "best"}, "--eval-strategy must be steps, epoch or no"),
        ({"max_steps": 3, "steps": 2}, "give one"),
        ({"num_train_epochs": math.nan}, "--num-train-epochs must be a positive finite"),
    ],
)
def test_a_bad_trl_value_is_refused_naming_it(given, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**given).check()


def test_inert_fields_take_any_value_and_read_back():
    config = GRPOConfig(dataloader_num_workers=4, disable_tqdm=True, ddp_timeout=60)
    assert (config.dataloader_num_workers, config.disable_tqdm, config.ddp_timeout) == (4, True, 60)
    assert GRPOConfig().dataloader_num_workers == 0  # TRL's default when not set
    with pytest.raises(AttributeError):
        GRPOConfig().no_such_setting  # noqa: B018


def test_trls_batch_arithmetic():
    """The generation batch is per_device_train_batch_size x steps_per_generation completions
    (or generation_batch_size), num_generations to a prompt; the command keeps num_prompts."""
    assert GRPOConfig().batch_size == 8 and GRPOConfig().num_prompts == 1
    config = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert (config.batch_size, config.micro_batches, config.optimizer_steps_per_batch) == (8, 2, 1)
    assert GRPOConfig(generation_batch_size=32, num_generations=4).num_prompts == 8
    with pytest.raises(ValueError, match="multiple of --num-generations 3"):
        GRPOConfig(num_generations=3)
    assert GRPOCommandConfig().batch_size == 64 and GRPOCommandConfig().micro_batches == 1


@pytest.mark.parametrize(
    ("given", "rows", "steps"),
    [
        ({"max_steps": 7}, 10, 7),
        ({}, 10, 30),  # 3 epochs (TRL's default) of 10 one-prompt batches
        ({"num_train_epochs": 1.5, "generation_batch_size": 24}, 10, 5),  # 3 prompts: 3 a pass
        ({"num_iterations": 2, "max_steps": 8}, 10, 4),  # 2 optimizer steps a batch
    ],
)
def test_trls_run_length(given, rows, steps):
    assert GRPOConfig(**given).with_steps(rows).steps == steps


def test_a_built_in_task_needs_a_length():
    with pytest.raises(ValueError, match="a built-in task has no epochs: give --max-steps"):
        GRPOConfig().with_steps(0)


def test_the_command_keeps_its_documented_defaults():
    command = GRPOCommandConfig()
    assert (command.seed, command.staleness, command.entropy_coef, command.steps) == (
        0,
        1,
        0.05,
        500,
    )
    assert command.lr_scheduler_type == "constant" and command.save_strategy == "no"
    trl = GRPOConfig()
    assert (trl.seed, trl.staleness, trl.entropy_coef, trl.lr_scheduler_type) == (
        42,
        0,
        0.0,
        "linear",
    )


@needs_trl
def test_the_guide_for_trl_users_lists_every_field_as_the_code_takes_it(capsys):
    """docs/from_trl.md's table is tools/trl_table.py's output for the installed TRL."""
    import runpy

    runpy.run_path(str(ROOT / "tools/trl_table.py"), run_name="__main__")
    table = capsys.readouterr().out
    text = (ROOT / "docs/from_trl.md").read_text()
    assert table in text, "regenerate the table: python tools/trl_table.py"
    missing = [name for name in trl_fields() if f"`{name}`" not in table]
    assert not missing


def test_data_seed_orders_the_prompts_and_seed_the_rest():
    from nostall.algos.grpo import Inputs, build

    rows = [{"prompt": f"{i}="} for i in range(16)]

    def first_prompts(**given):
        args = GRPOConfig(model="tiny", max_steps=2, save_strategy="no", watch_syncs=False, **given)
        setup = build(args, Inputs(rows=rows))
        source = setup.generator.source
        return [row["prompt"] for row in source.batch(8)], setup.generator.generator.initial_seed()

    by_seed, sampling = first_prompts(seed=3)
    assert first_prompts(seed=3, data_seed=3) == (by_seed, sampling)
    other, same_sampling = first_prompts(seed=3, data_seed=4)
    assert other != by_seed and same_sampling == sampling
