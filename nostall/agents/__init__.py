"""Language-model agents: multi-turn episodes with text environments (Gymnasium's shape),
decoded while their environments work (episodes.py), written into GRPO batches (fill.py)."""

from nostall.agents.text_env import EnvError, GuessNumber

__all__ = ["EnvError", "GuessNumber"]
