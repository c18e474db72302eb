"""GRPO for causal language models, its generation overlapped with training.

Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300) as TRL's GRPOTrainer
runs it, with TRL's names, and the waits taken out:
- each step draws `num_prompts` prompts, samples `num_generations` completions of each with the
  rollout side's copy of the model (a native sampler, a static KV cache, no host read per
  token: nostall/lm/generation.py) and scores them with the reward functions there, off the
  trainer's critical path;
- advantages are the rewards minus their group's mean, over the group's std (`scale_rewards`
  "group"), the batch's ("batch") or not scaled ("none", Dr. GRPO): `nostall.group_advantages`;
- token log-probabilities come from the final hidden states and the output weight in chunks
  (`nostall.token_log_prob_linear`, no [B, T, V] logits), renormalised over the tokens the
  sampler may draw (special tokens other than <eos> are never sampled);
- the clipped surrogate is `nostall.clipped_policy_loss` with TRL's `loss_type`: "grpo" (per
  sequence token mean, then the mean), "bnpo" and "dapo" (mean over all tokens of the batch),
  "dr_grpo" (token sum over batch * max_new_tokens); clip [1 - clip_low, 1 + clip_high];
  optional KL to the frozen initial model (`beta`, k3 estimator) aggregated the same way;
- an optional entropy bonus (`entropy_coef`, `nostall.token_entropy_linear`, the same chunks);
- `staleness` S lets generation run up to S policy versions ahead of the trainer (S = 0:
  generate then train, exactly synchronous GRPO). Stale batches use the decoupled objective
  (AReaL, Fu et al. 2025): the clip against the proximal policy (the trainer's weights before
  the update, log-probs recomputed), each token weighted by pi_prox / pi_behaviour (of the
  token or of the completion, bounded as TRL's vllm_importance_sampling_mode says).

- `dtype` "bfloat16" (auto where the hardware has bf16 arithmetic, for a real model) runs
  generation and the update on a bf16 copy over float32 master weights and Adam state
  (nostall/lm/precision.py); the gap between generation's and the trainer's log-probs is
  reported every update and, where they can differ, corrected by the capped weight above.
Read top to bottom:
- config.py: every setting, TRL's names and defaults, and the command's (GRPOCommandConfig);
  training_args.py: transformers' training arguments under it (after every run's:
  nostall/train/run_config.py); trl_names.py: TRL's other names, accepted or refused;
  config_checks.py: the settings' checks;
  runtime_options.py: the checks of where it generates;
- loss.py: log-probs and the clipped surrogate; update.py: an update on one batch;
  explicit_update.py: the same update by explicit adjoints, no autograd graph;
- generation.py: the generation side (prompts, rewards, engine, GroupGenerator), built in
  the trainer's process or where a transport runs it;
- setup.py: what a run builds, once each and in order (prompts, rewards, the model and its
  precision, the generation side and its transport, the optimizer, the reference model);
- state.py: a checkpoint's state, its restore, the model saved for transformers;
- sharded.py, ranks.py: `--trainers M`, the update sharded over ranks;
- result.py: what a run returns; trainer.py: the run as the shared loop's hooks, and TRL's
  constructor; trl_inputs.py: that constructor's arguments as the run's inputs;
  trl_surface.py: what TRL's trainer shows (callbacks, TrainerState, checkpoint-N folders);
  evaluation.py: evaluate() and pass@k.
"""

from nostall.algos.grpo.config import AGGREGATIONS, GRPOCommandConfig, GRPOConfig
from nostall.algos.grpo.loss import (
    aggregate,
    grpo_loss,
    head_entropy,
    head_log_probs,
    policy_head,
    policy_log_probs,
)
from nostall.algos.grpo.result import GRPOResult
from nostall.algos.grpo.setup import Inputs, Setup, build
from nostall.algos.grpo.trainer import GRPOTrainer, train
from nostall.algos.grpo.update import CLIP_RATIOS, METRICS, UpdateContext, grpo_update

__all__ = [
    "AGGREGATIONS",
    "CLIP_RATIOS",
    "METRICS",
    "GRPOCommandConfig",
    "GRPOConfig",
    "GRPOResult",
    "GRPOTrainer",
    "Inputs",
    "Setup",
    "UpdateContext",
    "aggregate",
    "build",
    "grpo_loss",
    "grpo_update",
    "head_entropy",
    "head_log_probs",
    "policy_head",
    "policy_log_probs",
    "train",
]
