"""The examples run as documented."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_grpo_step_example_runs_and_produces_a_gradient():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "grpo_step.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    match = re.search(r"loss (\S+) .* \|grad weight\| (\S+)", out.stdout)
    assert match, out.stdout
    loss, grad_norm = float(match.group(1)), float(match.group(2))
    assert loss == loss and grad_norm > 0  # finite loss, a real gradient reached the weight
