"""`nostall eval RUN_DIR`: the return of a trained policy over N episodes, and a recording of one
episode for a person to look at.

Each of the N episodes is the first episode of its own environment (N environments stepped
together), so short episodes are not over-represented, as they would be if one env's episodes
were counted until N had finished."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import torch

from nostall.algos.ppo.policy import Policy
from nostall.envs import ENVS
from nostall.envs.backends import make_env
from nostall.envs.gymnasium_adapter import make_one

# A guard against an environment with no time limit and a policy that never ends an episode.
MAX_EPISODE_STEPS = 100_000


def evaluate(policy: Policy, episodes: int, seed: int = 0) -> dict:
    """Mean, spread and every return of `episodes` episodes."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    env = make_env(
        policy.env_id,
        episodes,
        seed=seed,
        backend=policy.env_backend,
        frame_stack=policy.frame_stack,
    )
    try:
        obs = env.torch.reset(seed=seed).numpy()  # sync: none; the env's tensors are host ones
        out = env.torch.empty_step()
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        finished = np.zeros(episodes, dtype=bool)
        for _ in range(MAX_EPISODE_STEPS):
            actions = policy(obs)
            env.torch.step(_as_tensor(actions, policy.discrete), out=out)
            live = ~finished
            returns[live] += out.reward.numpy()[live]  # sync: none; host rows, as above
            lengths[live] += 1
            finished |= (out.terminated | out.truncated).numpy()  # sync: none; host rows
            if finished.all():
                break
            obs = out.obs.numpy().copy()  # sync: none; host rows, kept past the next step
    finally:
        env.close()
    values = returns.tolist()  # sync: none; a NumPy array
    return {
        "env_id": policy.env_id,
        "episodes": episodes,
        "deterministic": policy.deterministic,
        "mean_return": statistics.fmean(values),
        "std_return": statistics.pstdev(values),
        "min_return": min(values),
        "max_return": max(values),
        "mean_length": float(lengths.mean()),
        "returns": values,
        "unfinished": int((~finished).sum()),
    }


def _as_tensor(actions: np.ndarray, discrete: bool) -> torch.Tensor:
    return torch.as_tensor(actions.astype(np.int64) if discrete else actions.astype(np.float32))


def record(policy: Policy, path: str | Path, seed: int = 0, fps: int = 30) -> int:
    """Plays one episode and writes its frames to `path` (.gif; .mp4 with imageio's ffmpeg
    plugin installed); returns the number of frames."""
    path = Path(path)
    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ValueError(f"--record: {path.name} must end in .gif or .mp4")
    if policy.env_backend == "envpool":
        frames = _record_envpool(policy, seed)
    else:
        frames = _record_one(policy, seed)
    _write_frames(frames, path, fps)
    return len(frames)


def _record_one(policy: Policy, seed: int) -> list[np.ndarray]:
    """The frames of one episode of a native env (a vector env of one) or a Gymnasium one."""
    native = policy.env_backend != "gymnasium" and policy.env_id in ENVS
    if native:
        from nostall.envs import make

        env = make(policy.env_id, 1, seed=seed, render_mode="rgb_array")
        render = lambda: env.render()[0]  # noqa: E731
    else:
        try:
            env = make_one(policy.env_id, policy.frame_stack)(render_mode="rgb_array")
        except TypeError as e:  # a module:EnvClass whose constructor takes no render_mode
            raise ValueError(f"--record: {policy.env_id} cannot render RGB frames ({e})") from e
        render = env.render
    try:
        obs, _ = env.reset(seed=seed)
        frames = [render()]
        for _ in range(MAX_EPISODE_STEPS):
            action = policy(obs.reshape(1, -1))
            obs, _, terminated, truncated, _ = env.step(action if native else action[0])
            frames.append(render())
            if np.any(terminated) or np.any(truncated):
                break
    finally:
        env.close()
    return frames


def _record_envpool(policy: Policy, seed: int) -> list[np.ndarray]:
    """The frames of one episode of an EnvPool env, stepped through the adapter as in
    training. Its same-step reset makes a fresh start of the frame after the last step, so
    that one is left out."""
    from nostall.envs.envpool_adapter import EnvPoolVectorEnv

    env = EnvPoolVectorEnv(
        policy.env_id, 1, seed=seed, render_mode="rgb_array", frame_stack=policy.frame_stack
    )
    try:
        obs = env.torch.reset().numpy()  # sync: none; host rows
        out = env.torch.empty_step()
        frames = [env.render()[0]]
        for _ in range(MAX_EPISODE_STEPS):
            env.torch.step(_as_tensor(policy(obs), policy.discrete), out=out)
            if bool(out.terminated[0] or out.truncated[0]):  # sync: none; host rows
                break
            frames.append(env.render()[0])
            obs = out.obs.numpy().copy()  # sync: none; host rows, kept past the next step
    finally:
        env.close()
    return frames


def _write_frames(frames: list[np.ndarray], path: Path, fps: int) -> None:
    if path.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
        duration = max(1, math.floor(1000 / fps))
        images[0].save(path, save_all=True, append_images=images[1:], duration=duration, loop=0)
        return
    try:
        import imageio.v3 as iio
    except ImportError as e:
        raise ValueError("--record: writing .mp4 needs imageio[ffmpeg]; use .gif") from e
    iio.imwrite(path, np.stack(frames), fps=fps)


def format_eval(summary: dict) -> str:
    mode = "deterministic" if summary["deterministic"] else "sampled"
    text = (
        f"{summary['env_id']}: {summary['episodes']} episodes, {mode} policy: return "
        f"{summary['mean_return']:.2f} +- {summary['std_return']:.2f} (min "
        f"{summary['min_return']:.2f}, max {summary['max_return']:.2f}), mean length "
        f"{summary['mean_length']:.1f}"
    )
    if summary["unfinished"]:
        text += f"; {summary['unfinished']} episodes unfinished after {MAX_EPISODE_STEPS} steps"
    return text
