"""`nostall profile` on code nobody here wrote for it, against lists of true sync sites written
by reading that code as it would run on a GPU: the CleanRL-style PPO of examples/cleanrl_ppo.py
(CleanRL's ppo.py loop over Gymnasium), Stable-Baselines3's PPO and TRL's GRPOTrainer at pinned
versions. Precision and recall must both be 1.0."""

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cleanrl_ppo.py"

# (a fragment of the line, the kind): every site where this loop makes the host wait on a GPU.
CLEANRL_SITES = {
    # Distribution.__init__ checks the logits against their constraint: a host read.
    ("probs = Categorical(logits=self.actor(x))", "distributions validation"),
    # multinomial(probs, 1) reads back on the host.
    ("action = probs.sample()", "multinomial"),
    # log_prob validates its sample (_validate_sample).
    ("return action, probs.log_prob(action)", "distributions validation"),
    # The environment takes NumPy actions: a blocking copy to the host every step.
    ("envs.step(action.cpu().numpy())", "copy to host"),
    # Observations, rewards and dones from NumPy, copied from pageable memory (the first
    # observation before the loop too).
    ("rewards[step] = torch.tensor(reward).to(device)", "copy to device"),
    ("next_obs = torch.Tensor(next_obs).to(device)", "copy to device"),
    ("next_done = torch.Tensor(next_done).to(device)", "copy to device"),
    # Minibatch indices are a NumPy array: each indexing of a device tensor copies them over.
    ("b_obs[mb], b_actions.long()[mb]", "copy to device"),
    ("ratio = (newlogprob - b_logprobs[mb]).exp()", "copy to device"),
    ("mb_adv = (b_adv[mb] - b_adv[mb].mean())", "copy to device"),
    ("v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb])", "copy to device"),
    # The final loss, read for the print.
    ("return loss.item()", "item"),
}
# Not syncs, though they look like them: the GAE loop's device arithmetic, writes of device
# values into device buffers, clip_grad_norm_ (its clip coefficient stays on the device) and
# Adam's step counter (a host tensor without capturable=True).


def _profile(script: Path, *args: str) -> dict:
    # (SB3 makes a log folder under the temporary directory when given none: the test's own)
    with tempfile.TemporaryDirectory() as logs:
        result = subprocess.run(
            [sys.executable, "-m", "nostall.cli", "profile", "--json", str(script), "--", *args],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
            env={**os.environ, "SB3_LOGDIR": logs},
        )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _score(found: set, true: set, name: str) -> tuple[float, float]:
    precision = len(found & true) / len(found) if found else 0.0
    recall = len(found & true) / len(true)
    print(
        f"{name}: {len(found)} sites found, {len(true)} true; precision {precision:.3f}, "
        f"recall {recall:.3f}"
    )
    return precision, recall


def _true_sites() -> set[tuple[int, str]]:
    lines = EXAMPLE.read_text().splitlines()
    sites = set()
    for fragment, kind in CLEANRL_SITES:
        found = [n for n, line in enumerate(lines, 1) if fragment in line]
        assert found, f"{fragment!r} is not in the example any more"
        sites.update((n, kind) for n in found)
    return sites


def test_cleanrl_style_ppo_precision_and_recall():
    report = _profile(EXAMPLE, "--iterations", "1", "--num-steps", "8")
    found = {
        (s["line"], s["kind"]) for s in report["unintended"] if Path(s["file"]).resolve() == EXAMPLE
    }
    elsewhere = [s for s in report["unintended"] if Path(s["file"]).resolve() != EXAMPLE]
    assert not elsewhere, elsewhere  # every site is at the script's own lines
    true = _true_sites()
    assert _score(found, true, "CleanRL-style PPO") == (1.0, 1.0), (
        sorted(found - true),
        sorted(true - found),
    )


SB3_VERSION = "2.9.2"
# Stable-Baselines3 2.9.2's PPO (MlpPolicy, discrete actions), one rollout-and-train cycle: every
# site where it makes the host wait on a GPU, as (file in the package, line fragment, kind); a
# fragment means its first line in the file (RolloutBuffer and CategoricalDistribution come
# before the Dict and other variants that repeat their lines).
SB3_SITES = {
    # Rollout: observations to the device (also the last one, for the bootstrap value).
    ("common/utils.py", "return th.as_tensor(obs, device=device)", "copy to device"),
    # Categorical: its logits validated at construction, each sample validated by log_prob,
    # multinomial sampling.
    (
        "common/distributions.py",
        "self.distribution = Categorical(logits=action_logits)",
        "distributions validation",
    ),
    (
        "common/distributions.py",
        "return self.distribution.log_prob(actions)",
        "distributions validation",
    ),
    ("common/distributions.py", "return self.distribution.sample()", "multinomial"),
    # Actions to NumPy for the env; values and log-probs into the NumPy rollout buffer.
    ("common/on_policy_algorithm.py", "actions = actions.cpu().numpy()", "copy to host"),
    ("common/buffers.py", "self.values[self.pos] = value.clone().cpu().numpy()", "copy to host"),
    (
        "common/buffers.py",
        "self.log_probs[self.pos] = log_prob.clone().cpu().numpy()",
        "copy to host",
    ),
    ("common/buffers.py", "last_values = last_values.clone().cpu().numpy()", "copy to host"),
    # Training: each minibatch field from the NumPy buffer to the device.
    ("common/buffers.py", "return th.tensor(array, device=self.device)", "copy to device"),
    # Statistics read every minibatch for the logger.
    ("ppo/ppo.py", "pg_losses.append(policy_loss.item())", "item"),
    (
        "ppo/ppo.py",
        "clip_fraction = th.mean((th.abs(ratio - 1) > clip_range).float()).item()",
        "item",
    ),
    ("ppo/ppo.py", "value_losses.append(value_loss.item())", "item"),
    ("ppo/ppo.py", "entropy_losses.append(entropy_loss.item())", "item"),
    (
        "ppo/ppo.py",
        "approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()",
        "copy to host",
    ),
    ("ppo/ppo.py", 'self.logger.record("train/loss", loss.item())', "item"),
}
# Not syncs: the NumPy rollout buffer's own work (GAE in compute_returns_and_advantage,
# explained_variance), the advantage normalisation and clip_grad_norm_ (device ops), Adam's host
# step counter. Not exercised in 512 steps (CartPole truncates only at 500 steps of one
# episode): the truncation bootstrap `rewards[idx] += self.gamma * terminal_value`, a scalar read.


@pytest.mark.slow
def test_stable_baselines3_ppo_precision_and_recall():
    try:
        version = importlib.metadata.version("stable-baselines3")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("stable-baselines3 is not installed (pip install stable-baselines3==2.9.2)")
    if version != SB3_VERSION:
        pytest.skip(
            f"the list of true sites was written for stable-baselines3 {SB3_VERSION}, "
            f"{version} is installed"
        )
    import stable_baselines3

    package = Path(stable_baselines3.__file__).resolve().parent
    report = _profile(ROOT / "tests" / "profiler" / "real_code" / "sb3_ppo.py", "512")
    found = set()
    for s in report["unintended"]:
        path = Path(s["file"]).resolve()
        assert path.is_relative_to(package), s  # no site outside SB3: the script has none
        found.add((path.relative_to(package).as_posix(), s["line"], s["kind"]))
    true = set()
    for file, fragment, kind in SB3_SITES:
        lines = (package / file).read_text().splitlines()
        matches = [n for n, line in enumerate(lines, 1) if fragment in line]
        assert matches, (file, fragment)
        true.add((file, matches[0], kind))
    assert _score(found, true, "Stable-Baselines3 PPO") == (1.0, 1.0), (
        sorted(found - true),
        sorted(true - found),
    )


TRL_SITES = Path(__file__).resolve().parent / "real_code" / "trl_grpo_sites.json"


def _site_packages_line(package_root: Path, file: str, text: str, occurrence: int) -> int:
    lines = (package_root / file).read_text().splitlines()
    matches = [n for n, line in enumerate(lines, 1) if line.strip() == text]
    assert len(matches) > occurrence, (file, text)
    return matches[occurrence]


@pytest.mark.slow
def test_trl_grpo_trainer_precision_and_recall():
    listed = json.loads(TRL_SITES.read_text())
    for package, wanted in listed["versions"].items():
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{package} is not installed (pip install {package}=={wanted})")
        if version != wanted:
            pytest.skip(
                f"the list of true sites was written for {package} {wanted}, {version} is installed"
            )
    import transformers

    root = Path(transformers.__file__).resolve().parent.parent  # site-packages
    report = _profile(ROOT / "tests" / "profiler" / "real_code" / "trl_grpo.py", "4")
    found = set()
    for s in report["unintended"]:
        path = Path(s["file"]).resolve()
        assert path.is_relative_to(root), s  # all inside TRL and transformers
        found.add((path.relative_to(root).as_posix(), s["line"], s["kind"]))
    true = {
        (
            site["file"],
            _site_packages_line(root, site["file"], site["line_text"], site["occurrence"]),
            site["kind"],
        )
        for site in listed["sites"]
    }
    assert _score(found, true, "TRL GRPOTrainer") == (1.0, 1.0), (
        sorted(found - true),
        sorted(true - found),
    )
