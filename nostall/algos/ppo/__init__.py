"""PPO with GAE on nostall's native environments, its rollout overlapped with training.

In the spirit of CleanRL's ppo.py (Schulman et al. 2017, arXiv:1707.06347; the 37
implementation details, Huang et al. 2022), with the waits taken out:
- the environments are native and step through custom operators, writing into preallocated
  time-major chunks (no per-step allocation, no NumPy);
- actions are sampled on the device without a sync (Gumbel-max), and by default a whole
  rollout chunk (policy, sampling, environment steps) is one native call;
- GAE is the native `nostall.gae` operator, truncation-correct;
- a minibatch's loss (clipped surrogate, clipped value loss, entropy) is one `nostall.ppo_loss`
  op for discrete actions (`ppo_loss_from_log_prob` after the Gaussian's log-probabilities for
  continuous ones), and the clip plus Adam step one lean `ClippedAdam` step;
- the learning rate is a tensor, and metrics are read only every `log_interval` iterations, so
  the steady-state iteration has no host-device sync;
- a rollout thread collects the next chunk while the trainer updates on this one; with
  `staleness = 0` (the default here) the two strictly alternate: exactly synchronous PPO;
- with `device = "cuda"` the update runs on the GPU and the rollout side stays on the CPU, the
  hand-offs on streams and events (nostall/runtime/device.py).
The asynchronous variant, with V-trace correction for stale chunks, is nostall/algos/appo/.

Read top to bottom: config.py (every setting), agent.py / conv_agent.py / policies.py (the
actor-critic), update.py (GAE targets and the clipped-surrogate epochs), setup.py (the
environments and the transport), trainer.py (the run as the shared loop's hooks), state.py
(checkpoints), ranks.py (data-parallel trainers), policy.py / evaluate.py (the trained policy).
"""

from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.result import PPOResult
from nostall.algos.ppo.state import load_checkpoint
from nostall.algos.ppo.trainer import PPOTrainer, train
from nostall.algos.ppo.update import Targets, bootstrap_values, gae_advantages, ppo_update

__all__ = [
    "PPOConfig",
    "PPOResult",
    "PPOTrainer",
    "Targets",
    "bootstrap_values",
    "gae_advantages",
    "load_checkpoint",
    "ppo_update",
    "train",
]
