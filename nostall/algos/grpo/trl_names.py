"""The names of TRL's GRPOConfig (and of transformers' TrainingArguments under it) that are not
fields of nostall's GRPOConfig: each is accepted, with TRL's meaning where it has one here, or
refused by name with what to use instead. A script written for TRL reads and sets them as it
did; none is ever Python's bare "unexpected keyword argument".

- `INERT`: settings of machinery nostall does not have (a DataLoader, DDP, the Hub's uploads
  when nothing is uploaded, log levels): any value is taken and kept, and changes nothing.
- `DEFAULT_ONLY`: settings nostall cannot honour: TRL's default is taken (a script that leaves
  them alone runs), any other value is refused naming the setting and what to use instead.

Fields nostall honours are GRPOConfig's own (config.py), some under nostall's name through
`ALIASES` there. docs/from_trl.md tabulates all of them; tests/algos/grpo/test_trl_fields.py
walks TRL's own dataclass, when TRL is installed, and holds every field to one of these."""

from __future__ import annotations

_NO_DATALOADER = "nostall reads the prompts from host rows, not through a DataLoader"
_ONE_PROCESS = "set up by a launcher for DDP; nostall's trainer ranks are Ray actors"
_LOGS = "how transformers prints its logs; nostall's output is its own"
_EVAL_LOOP = "a setting of transformers' prediction loop, which GRPO's evaluation does not use"
_NO_UPLOAD = "read only with push_to_hub=True, which nostall refuses"
_SCRIPT = "read by scripts, not by the trainer (as in transformers)"
_VLLM_SERVER = "read only with vllm_mode='server', which nostall refuses"

INERT: dict[str, str] = {
    **dict.fromkeys(
        (
            "dataloader_drop_last",
            "dataloader_num_workers",
            "dataloader_pin_memory",
            "dataloader_persistent_workers",
            "dataloader_prefetch_factor",
            "dataloader_multiprocessing_context",
            "dataloader_in_order",
            "label_names",
            "length_column_name",
            "pad_to_multiple_of",
        ),
        _NO_DATALOADER,
    ),
    **dict.fromkeys(
        (
            "local_rank",
            "ddp_find_unused_parameters",
            "ddp_bucket_cap_mb",
            "ddp_broadcast_buffers",
            "ddp_static_graph",
            "ddp_backend",
            "ddp_timeout",
            "save_on_each_node",
            "ds3_gather_for_generation",
        ),
        _ONE_PROCESS,
    ),
    **dict.fromkeys(
        (
            "disable_tqdm",
            "log_level",
            "log_level_replica",
            "log_on_each_node",
            "logging_nan_inf_filter",
            "skip_memory_metrics",
            "debug",
            "project",
            "trackio_space_id",
            "trackio_bucket_id",
            "trackio_static_space_id",
            "log_multimodal",
            "log_unique_prompts",
            "num_completions_to_print",
        ),
        _LOGS,
    ),
    **dict.fromkeys(
        (
            "prediction_loss_only",
            "eval_do_concat_batches",
            "eval_use_gather_object",
            "eval_accumulation_steps",
            "include_for_metrics",
            "batch_eval_metrics",
        ),
        _EVAL_LOOP,
    ),
    **dict.fromkeys(
        (
            "hub_token",
            "hub_private_repo",
            "hub_model_id",
            "hub_strategy",
            "hub_always_push",
            "hub_revision",
        ),
        _NO_UPLOAD,
    ),
    **dict.fromkeys(("do_train", "do_eval", "do_predict", "resume_from_checkpoint"), _SCRIPT),
    **dict.fromkeys(
        (
            "vllm_server_base_url",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_server_timeout",
            "vllm_group_port",
        ),
        _VLLM_SERVER,
    ),
    "use_cache": "generation always decodes from a KV cache, the update never keeps one",
    "gradient_checkpointing_kwargs": "nostall's checkpointing is non-reentrant (TRL's usual "
    "{'use_reentrant': False})",
    "disable_dropout": "nostall's forward passes have no dropout: a model trains as with "
    "disable_dropout=True",
    **dict.fromkeys(
        (
            "delta",
            "sapo_temperature_neg",
            "sapo_temperature_pos",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
        ),
        "read only by loss types nostall refuses (two-sided clipping, sapo, vespo)",
    ),
    **dict.fromkeys(
        ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
        "read only with use_adaptive_entropy=True, which nostall refuses",
    ),
    **dict.fromkeys(
        ("ref_model_mixup_alpha", "ref_model_sync_steps"),
        "read only with sync_ref_model=True, which nostall refuses",
    ),
}

_RANKS = "trainers=N with backend='ray' (FSDP2 ranks)"

# name -> (TRL's default, what to use instead of another value)
DEFAULT_ONLY: dict[str, tuple[object, str]] = {
    "lr_scheduler_kwargs": (None, "lr_scheduler_type (constant, linear, cosine) and warmup_steps"),
    "optim_args": (None, "adam_beta1, adam_beta2, adam_epsilon, weight_decay"),
    "optim_target_modules": (None, "peft_config to train some modules only"),
    "label_smoothing_factor": (0.0, "nothing: GRPO's loss has no labels to smooth"),
    "bf16_full_eval": (False, "bf16=True (evaluation generates as training does)"),
    "fp16_full_eval": (False, "bf16=True"),
    "tf32": (None, "torch.backends.cuda.matmul.allow_tf32 in the script"),
    "activation_checkpointing": (None, "gradient_checkpointing=True"),
    "activation_checkpointing_kwargs": (None, "gradient_checkpointing=True"),
    "torch_compile": (False, "nothing: nostall's update runs fused native ops"),
    "torch_compile_backend": (None, "nothing: nostall's update runs fused native ops"),
    "torch_compile_mode": (None, "nothing: nostall's update runs fused native ops"),
    "use_liger_kernel": (False, "nothing: nostall's loss is a fused native op"),
    "liger_kernel_config": (None, "nothing: nostall's loss is a fused native op"),
    "neftune_noise_alpha": (None, "nothing (no embedding noise in GRPO here)"),
    "torch_empty_cache_steps": (None, "nothing: nostall returns freed memory itself"),
    "auto_find_batch_size": (False, "per_device_train_batch_size"),
    "logging_strategy": ("steps", "logging_steps"),
    "logging_first_step": (False, "logging_steps"),
    "include_num_input_tokens_seen": ("no", "the logged num_tokens"),
    "eval_delay": (0, "eval_steps"),
    "eval_on_start": (False, "trainer.evaluate() before trainer.train()"),
    "save_only_model": (False, "save_model(dir) for the model alone"),
    "enable_jit_checkpoint": (False, "save_steps"),
    "push_to_hub": (False, "save_model(dir), then huggingface_hub's upload_folder"),
    "load_best_model_at_end": (False, "the checkpoint-N folders, each loadable"),
    "metric_for_best_model": (None, "the logged eval_reward"),
    "greater_is_better": (None, "the logged eval_reward"),
    "ignore_data_skip": (False, "nothing: a resume goes on from the checkpoint's prompt"),
    "restore_callback_states_from_checkpoint": (False, "callbacks of the resumed script"),
    "full_determinism": (False, "seed: a run is reproducible on one machine"),
    "train_sampling_strategy": ("random", "shuffle_dataset"),
    "accelerator_config": (None, _RANKS),
    "parallelism_config": (None, _RANKS),
    "fsdp": (None, _RANKS),
    "fsdp_config": (None, _RANKS),
    "deepspeed": (None, _RANKS),
    "trust_remote_code": (False, "a model whose architecture transformers has"),
    "model_init_kwargs": (None, "a model object loaded as you like, given as `model`"),
    "router_aux_loss_coef": (None, "a dense model (no router loss here)"),
    "cast_lm_head_to_fp32": (False, "dtype='float32'"),
    "shuffle_dataset": (True, "a dataset in the order you want it walked, shuffled each epoch"),
    "generation_kwargs": (None, "temperature, top_k, top_p, min_p, repetition_penalty"),
    "chat_template_kwargs": (None, "prompts rendered to text in the dataset"),
    "cache_implementation": (None, "nothing: the engine keeps its own KV cache"),
    "vllm_mode": ("colocate", "vllm_mode='colocate' (vLLM in the generating process)"),
    "vllm_model_impl": ("vllm", "vllm_model_impl='vllm'"),
    "vllm_enable_sleep_mode": (False, "vllm_gpu_memory_utilization"),
    "vllm_structured_outputs_regex": (None, "a reward that checks the format"),
    "remove_unused_columns": (
        False,
        "reward functions that take **kwargs (every column reaches them)",
    ),
    "average_tokens_across_devices": (True, "the default: trainer ranks reproduce one rank's loss"),
    "vllm_max_model_length": (None, "max_completion_length"),
    "vllm_tensor_parallel_size": (1, "one vLLM engine a worker, num_workers of them"),
    "importance_sampling_level": ("token", "importance_sampling_level='token'"),
    "multi_objective_aggregation": ("sum_then_normalize", "reward_weights"),
    "sync_ref_model": (False, "beta with the initial model as the reference"),
    "top_entropy_quantile": (1.0, "entropy_coef"),
    "use_adaptive_entropy": (False, "entropy_coef"),
    "off_policy_mask_threshold": (None, "staleness=0, or is_cap"),
    "log_completions_hub_repo": (None, "log_completions=True (written into output_dir)"),
    "use_transformers_continuous_batching": (False, "nostall's engine (generator='native')"),
    "transformers_continuous_batching_config": (None, "nostall's engine (generator='native')"),
    "use_transformers_paged": (False, "nostall's engine (generator='native')"),
}


def take(name: str, value) -> None:
    """ValueError when `name` (one of DEFAULT_ONLY) is given a value nostall cannot honour."""
    default, instead = DEFAULT_ONLY[name]
    if value != default:
        raise ValueError(
            f"GRPOConfig: {name}={value!r} is TRL's, and nostall cannot honour it (TRL's "
            f"default, {default!r}, is accepted); use {instead}"
        )


def outside_default(name: str):
    """The value a TRL name that is not a field reads as when the script did not set it."""
    if name in DEFAULT_ONLY:
        return DEFAULT_ONLY[name][0]
    return _INERT_DEFAULTS.get(name)


# TRL's defaults of the inert names that are not None (what a script reading one gets).
_INERT_DEFAULTS = {
    "dataloader_drop_last": False,
    "dataloader_num_workers": 0,
    "dataloader_pin_memory": True,
    "dataloader_persistent_workers": False,
    "dataloader_in_order": True,
    "length_column_name": "length",
    "pad_to_multiple_of": "auto",
    "local_rank": -1,
    "ddp_timeout": 1800,
    "save_on_each_node": False,
    "ds3_gather_for_generation": True,
    "log_level": "passive",
    "log_level_replica": "warning",
    "log_on_each_node": True,
    "logging_nan_inf_filter": True,
    "skip_memory_metrics": True,
    "debug": "",
    "project": "huggingface",
    "log_multimodal": True,
    "log_unique_prompts": False,
    "prediction_loss_only": False,
    "eval_do_concat_batches": True,
    "eval_use_gather_object": False,
    "include_for_metrics": [],
    "batch_eval_metrics": False,
    "hub_strategy": "every_save",
    "hub_always_push": False,
    "do_train": False,
    "do_eval": False,
    "do_predict": False,
    "vllm_server_host": "0.0.0.0",
    "vllm_server_port": 8000,
    "vllm_server_timeout": 240.0,
    "vllm_group_port": 51216,
    "use_cache": False,
    "disable_dropout": False,
    "sapo_temperature_neg": 1.05,
    "sapo_temperature_pos": 1.0,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
    "entropy_coef_min": 0.0,
    "entropy_coef_max": 1.0,
    "entropy_coef_delta": 0.005,
    "entropy_target": 0.2,
    "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512,
}

OUTSIDE_NAMES = frozenset(INERT) | frozenset(DEFAULT_ONLY)
