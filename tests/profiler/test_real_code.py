"""`nostall profile` on code nobody here wrote for it: the CleanRL-style PPO of
examples/cleanrl_ppo.py (CleanRL's ppo.py loop over Gymnasium, unchanged in its syncs), against
the list of its true sync sites written by reading the code as it would run on a GPU. Precision
and recall must both be 1.0."""

import json
import subprocess
import sys
from pathlib import Path

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


def _true_sites() -> set[tuple[int, str]]:
    lines = EXAMPLE.read_text().splitlines()
    sites = set()
    for fragment, kind in CLEANRL_SITES:
        found = [n for n, line in enumerate(lines, 1) if fragment in line]
        assert found, f"{fragment!r} is not in the example any more"
        sites.update((n, kind) for n in found)
    return sites


def test_cleanrl_style_ppo_precision_and_recall():
    result = subprocess.run(
        [sys.executable, "-m", "nostall.cli", "profile", "--json", str(EXAMPLE), "--",
         "--iterations", "1", "--num-steps", "8"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    found = {(s["line"], s["kind"]) for s in report["unintended"]
             if Path(s["file"]).resolve() == EXAMPLE}  # fmt: skip
    elsewhere = [s for s in report["unintended"] if Path(s["file"]).resolve() != EXAMPLE]
    assert not elsewhere, elsewhere  # every site is at the script's own lines
    true = _true_sites()
    precision = len(found & true) / len(found)
    recall = len(found & true) / len(true)
    print(f"CleanRL-style PPO: {len(found)} sites found, {len(true)} true; precision "
          f"{precision:.3f}, recall {recall:.3f}")  # fmt: skip
    assert (precision, recall) == (1.0, 1.0), (sorted(found - true), sorted(true - found))
