"""TRL's GRPOTrainer on nostall's tiny model and copy task, as benchmarks/lm/trl_grpo.py
configures it from TRL's documentation, for `nostall profile` (tests/profiler/test_real_code.py).
Argument: optimizer steps."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for benchmarks/

from benchmarks.lm.trl_grpo import run

run(seed=1, max_steps=int(sys.argv[1]), target=2.0, time_limit_s=1e9)
