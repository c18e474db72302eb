"""PPOTrainer: a PPO (or, with V-trace targets, APPO) run as the shared training loop's hooks.

    trainer = PPOTrainer(env="CartPole-v1", args=PPOConfig(total_timesteps=100_000))
    result = trainer.train()          # PPOResult: the curve, steps/s, when it was solved

Building the trainer builds the run (environments, actor-critic, optimizer, transport, and the
checkpoint's state when resuming); `train()` runs nostall.train.loop, whose order of taking,
updating, releasing, publishing and checkpointing every trainer shares. One step here is one
iteration: a chunk of num_envs * num_steps environment steps, one update on it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path

import torch
from gymnasium.vector import AutoresetMode

from nostall.algos.ppo.config import PPOConfig
from nostall.algos.ppo.policies import make_agent
from nostall.algos.ppo.policy import policy_record, save_policy
from nostall.algos.ppo.ranks import TrainerRanks
from nostall.algos.ppo.result import PPOResult
from nostall.algos.ppo.setup import make_run_env, make_transport
from nostall.algos.ppo.state import load_checkpoint, restore_rollout, rollout_state, snapshot
from nostall.algos.ppo.update import AdvantageFn, gae_advantages, ppo_update
from nostall.optim import ClippedAdam
from nostall.profiler import allow
from nostall.runtime.device import DeviceChunks
from nostall.runtime.episodes import WorkerEpisodes
from nostall.train import checkpoint, loop
from nostall.train.hooks import WritesOutputs
from nostall.train.loop import Clock, LogFn
from nostall.train.outputs import write_outputs
from nostall.train.schedule import learning_rate_at


class PPOTrainer(WritesOutputs):
    algorithm = "ppo"
    advantage_fn: AdvantageFn = staticmethod(gae_advantages)

    def __init__(self, env=None, args: PPOConfig | None = None):
        """`env`: an environment id (native, Gymnasium's, EnvPool's or module:EnvClass; the
        config's env_id when None) or a vector env object (nostall.envs.make(...), or an
        adapter from nostall.envs.backends.make_env), stepped by the thread backend."""
        args = PPOConfig() if args is None else args
        own_env = env is not None and not isinstance(env, str)
        if isinstance(env, str):
            args.env_id = env
        elif own_env:
            _check_own_env(env, args)
        args.check()
        self.config = args
        torch.set_num_threads(args.torch_threads)
        torch.manual_seed(args.seed)
        try:
            self.env = env if own_env else make_run_env(args)
        except ValueError as e:  # an unknown id, an unsupported space: named, before any run
            raise ValueError(f"env_id: {e}") from e
        if args.checkpoint:
            self.env.state_dict()  # an env that cannot be saved fails now, not at the first save
        info = self.env.info
        self.solved_return = (
            info.reward_threshold if args.solved_return is None else (args.solved_return)
        )
        device = torch.device(args.device)
        self.model = self.agent = make_agent(self.env, args.hidden, args.policy).to(device)
        self.published_model = self.model
        # A tensor on the trainer's device: annealing it needs no host value.
        self.lr = torch.tensor(args.learning_rate, device=device)
        # Gradient clipping and fused Adam in one lean step (nostall/optim.py).
        self.optimizer = ClippedAdam(
            self.agent.parameters(), lr=self.lr, max_grad_norm=args.max_grad_norm, eps=1e-5
        )
        self.generator = torch.Generator(device).manual_seed(args.seed + 1)
        self.transport = make_transport(args, self.env, self.agent, own_env)
        # Kept from the chunks the trainer receives, a tracker for each worker that fills them.
        self.episodes = WorkerEpisodes(
            args.num_workers if args.backend == "ray" else 1, args.num_envs
        )
        # Host chunks to the trainer's device.
        self.device_chunks = DeviceChunks(self.transport.slots[0], device)
        self.result = PPOResult(self.algorithm, asdict(args))
        self.first_step, self.last_step = 1, args.num_iterations
        if args.resume:
            state = load_checkpoint(args.resume, self.algorithm, args)
            self._restore(state)
            self.result.checkpoints = checkpoint.lineage(state, args.resume)
        self.ranks = TrainerRanks(
            args, self.agent, self.optimizer, self.generator, type(self).advantage_fn, self.env
        )
        self._lr_value = args.learning_rate
        self._episodes: tuple[int, float | None, float | None] = (0, None, None)
        self.report: str | None = None  # the report's text, once written

    def _restore(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr.copy_(state["lr"])
        for group in self.optimizer.param_groups:  # loading replaced it with a copy: annealing
            group["lr"] = self.lr  # must keep acting on the optimizer's learning rate
        self.generator.set_state(state["trainer_generator"])
        restore_rollout(self.transport, self.episodes, state["runtime"], self.agent)
        self.result.curve = [tuple(point) for point in state["curve"]]
        self.first_step = state["iteration"] + 1
        self.result.resumed_at_steps = state["iteration"] * self.config.batch_size
        self.result.steps = self.result.resumed_at_steps  # a finished run resumed: nothing to do

    # What a run leaves in its output_dir.
    outputs = ("report", "policy.pt", "learning_curve.png", "timeline.png", "tensorboard/")

    def train(self, log: LogFn | None = None) -> PPOResult:
        """Runs the loop, calling log(env_steps, metrics) every log_interval iterations; with
        an output_dir, writes the policy and the report there (`self.report`: its text)."""
        try:
            return loop.run(self, log)
        finally:
            self.env.close()

    def write_outputs(self, out_dir: Path) -> str:
        """policy.pt (nostall.algos.ppo.policy.load_policy), the report and its plots."""
        out_dir.mkdir(parents=True, exist_ok=True)
        save_policy(self.result.policy, out_dir / "policy.pt")
        self.report = write_outputs(self.result, out_dir, self.config.env_id)
        return self.report

    def progress_span(self) -> tuple[int, str, int]:
        """(total, unit, already done) of the run's progress, in environment steps."""
        batch = self.config.batch_size
        return self.last_step * batch, "step", (self.first_step - 1) * batch

    # -- the loop's hooks (nostall.train.loop.Hooks) --------------------------------------------
    def running(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.transport)
        stack.enter_context(self.ranks)  # the ranks join the cluster the transport started
        return stack

    def begin_step(self, step: int) -> None:
        args = self.config
        kind = "linear" if args.anneal_lr else "constant"
        self._lr_value = learning_rate_at(args.learning_rate, step, args.num_iterations, kind)
        if args.anneal_lr:
            self.lr.fill_(self._lr_value)

    def device_tensors(self, chunk):
        return chunk.tensors().values()

    def update(self, host_chunk, step: int) -> dict[str, torch.Tensor]:
        args = self.config
        chunk = self.device_chunks.to_device(host_chunk)
        self.ranks.dispatch(host_chunk, self._lr_value)  # ranks 1..M-1 start on their shards
        targets = type(self).advantage_fn(self.agent, chunk, args)
        metrics = ppo_update(
            self.agent, self.optimizer, chunk, targets, args, self.generator, (0, args.trainers)
        )
        self.ranks.wait()
        self.device_chunks.wait_copied()
        return metrics

    def record(self, chunk, lag: int, logging: bool) -> None:
        self.episodes.add_chunk(chunk)  # (one native op on the host chunk: no sync)
        if logging:  # before the publish lets the rollout side run on (with staleness 0, the
            # statistics are then exactly those of the chunks trained on so far)
            with allow("episode statistics every log_interval iterations"):
                self._episodes = self.episodes.recent(20)
                # sync: logging only (the tracker's counters, on the host)

    def publishes(self, step: int) -> bool:
        return step % self.config.publish_every == 0

    def at_boundary(self, step: int, clock: Clock) -> None:
        result = self.result
        result.steps = step * self.config.batch_size
        if result.first_iteration_at is None:
            result.first_iteration_at = (result.steps, time.perf_counter() - clock.started)

    def snapshot(self, step: int) -> dict:
        return snapshot(
            self.agent,
            self.optimizer,
            self.lr,
            rollout_state(self.transport, self.episodes),
            self.generator,
            step,
            self.result,
        )

    def checkpoint_path(self, step: int) -> str:
        return self.config.checkpoint.format(iteration=step)

    def log_values(self, step: int, values: dict[str, float], lag: int, clock: Clock):
        result = self.result
        finished, mean_return, mean_length = self._episodes
        with allow("metrics every log_interval iterations"):
            values.update(lr=float(self.lr), version_lag=float(lag), episodes=finished)
        seconds = time.perf_counter() - clock.started
        if mean_return is not None:
            values.update(episode_return=mean_return, episode_length=mean_length)
            result.curve.append((result.steps, seconds, mean_return))
            threshold = self.solved_return
            if threshold is not None and result.solved_at is None and mean_return >= threshold:
                result.solved_at = (result.steps, seconds)
        values["steps_per_second"] = (result.steps - result.resumed_at_steps) / seconds
        return result.steps, values

    def solved(self) -> bool:
        return self.result.solved_at is not None

    def interrupted(self) -> None:
        """The policy as it is (the last completed update's), when the run has an output_dir."""
        if self.config.output_dir:
            out_dir = Path(self.config.output_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            save_policy(policy_record(self.agent, self.env, self.config), out_dir / "policy.pt")

    def finish(self, clock: Clock, end: float) -> PPOResult:
        result = self.result
        result.seconds = end - clock.started
        result.final_return = result.curve[-1][2] if result.curve else None
        result.policy = policy_record(self.agent, self.env, self.config)
        return result


def _check_own_env(env, args: PPOConfig) -> None:
    """A vector env object steps the run as it is: it must have a native vector env's interface and
    reset in the same step (a finished episode's last observation apart, for bootstrapping)."""
    if not all(hasattr(env, name) for name in ("torch", "info", "num_envs", "state_dict")):
        raise ValueError(
            f"env must be an environment id or a vector env from "
            f"nostall.envs.make / nostall.envs.backends.make_env, got "
            f"{type(env).__name__}"
        )
    mode = getattr(env, "metadata", {}).get("autoreset_mode")
    if mode is not None and AutoresetMode(mode) != AutoresetMode.SAME_STEP:
        raise ValueError(f"env must reset in the same step (autoreset_mode='SameStep'), got {mode}")
    args.env_id, args.num_envs = env.info.id, env.num_envs


def train(args: PPOConfig, log: LogFn | None = None) -> PPOResult:
    """PPO with GAE: `PPOTrainer(args=args).train(log)`."""
    return PPOTrainer(args=args).train(log)
