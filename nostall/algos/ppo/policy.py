"""A trained policy as a file and as a callable: every `nostall train ppo|appo` run writes
`policy.pt` beside its report, and `load_policy` turns it back into observations -> actions.

The file is a plain dict of tensors, numbers and strings, so `torch.load(path, weights_only=True)`
reads it: no pickled code runs when a policy is loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nostall import files
from nostall.algos.ppo.agent import ActorCritic
from nostall.algos.ppo.conv_agent import ConvActorCritic

FORMAT = "nostall-policy-1"


def policy_record(agent: ActorCritic, env, args) -> dict:
    """What `policy.pt` holds: the actor-critic's weights (on the CPU) and what rebuilds it."""
    space = env.single_action_space
    record = {
        "format": FORMAT,
        "kind": "mlp",
        "env_id": args.env_id,
        "env_backend": args.env_backend,
        "frame_stack": int(args.frame_stack),
        "obs_dim": int(np.prod(env.single_observation_space.shape)),
        "discrete": bool(agent.discrete),
        "action_dim": int(space.n) if agent.discrete else int(np.prod(space.shape)),
        "hidden": int(args.hidden),
    }
    weights = agent.state_dict().items()
    # sync: once, at the end of a run: the weights come to the host to be saved
    record["state_dict"] = {k: v.detach().cpu().clone() for k, v in weights}  # sync: end of run
    if isinstance(agent, ConvActorCritic):
        record.update(
            kind="cnn", obs_shape=list(agent.obs_shape), channels_last=agent.channels_last
        )
    return record


def save_policy(record: dict, path: str | Path) -> None:
    """Written whole or not at all (nostall.files): a second Ctrl-C or a SIGKILL mid-write
    leaves the previous policy.pt."""
    with files.replaced(path) as f:
        torch.save(record, f)


class Policy:
    """Observations -> actions for a trained actor-critic. Deterministic by default (the most
    likely action, or the Gaussian's mean); `deterministic=False` samples as in training."""

    def __init__(self, record: dict, deterministic: bool = True, seed: int = 0):
        self.env_id = record["env_id"]
        self.env_backend = record.get("env_backend", "auto")
        self.frame_stack = int(record.get("frame_stack", 0))
        self.discrete = record["discrete"]
        if record.get("kind") == "cnn":
            self.agent = ConvActorCritic(
                record["obs_shape"],
                record["action_dim"],
                record["discrete"],
                record["channels_last"],
            )
        else:
            self.agent = ActorCritic(
                record["obs_dim"], record["action_dim"], record["discrete"], record["hidden"]
            )
        self.obs_dim = record["obs_dim"]
        self.agent.load_state_dict(record["state_dict"])
        self.agent.eval()
        self.deterministic = deterministic
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def __call__(self, obs):
        """A batch [N, obs_dim] (or one observation [obs_dim]) of NumPy or torch observations;
        returns the actions as NumPy, one per observation."""
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        single = x.dim() == 1
        x = x[None] if single else x
        if x.dim() != 2 or x.shape[1] != self.obs_dim:
            raise ValueError(
                f"observations must have shape [N, {self.obs_dim}] (images flattened), got "
                f"{list(x.shape)}"
            )
        out = self.agent.logits(x)
        if self.discrete:
            if self.deterministic:
                action = out.argmax(-1)
            else:
                action = torch.multinomial(out.softmax(-1), 1, generator=self.generator)[:, 0]
        else:
            action = out
            if not self.deterministic:
                noise = torch.randn(out.shape, generator=self.generator)
                action = out + self.agent.log_std.exp() * noise
        actions = action.numpy()  # sync: none; the policy runs on the CPU
        return actions[0] if single else actions


def load_policy(
    path: str | Path, deterministic: bool = True, seed: int = 0, env_id: str | None = None
) -> Policy:
    """The policy saved at `path` (a run's `policy.pt`, or the run directory itself), acting
    in the environment the file names or in `env_id`.

    A file chooses no code: an environment it names as "module:Class" (which the adapter
    would import and call) is refused unless the caller names it too, in `env_id` (the
    command's `--env`); only registered ids are taken from a file."""
    path = Path(path)
    if path.is_dir():
        path = path / "policy.pt"
    if not path.exists():
        raise FileNotFoundError(f"no policy at {path} (every training run writes policy.pt)")
    try:
        record = torch.load(path, weights_only=True)
    except Exception as e:  # not a torch file, or one holding code: either way not ours
        raise ValueError(f"{path} is not a nostall policy file ({type(e).__name__})") from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a nostall policy file")
    named = record.get("env_id")
    if env_id is not None:
        record = {**record, "env_id": env_id}
    elif not isinstance(named, str) or (":" in named and not _registered(named)):
        raise ValueError(
            f"{path} names the environment {named!r}, code to import: nostall takes only "
            f"registered environment ids from a file; to run that code, name it yourself "
            f"(nostall eval --env {named})"
        )
    return Policy(record, deterministic=deterministic, seed=seed)


def _registered(env_id: str) -> bool:
    import gymnasium as gym  # (only for an id that names a module)

    return env_id in gym.registry
