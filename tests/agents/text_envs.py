"""Text environments the tests name as module:Class (as a user names theirs)."""

import random


class Echo:
    """Say back the letter shown: "a" -> a, rewarded 1 each time, three turns."""

    def reset(self, *, seed=None, options=None):
        self.rng = random.Random(seed)
        self.letter, self.turn = self.rng.choice("abcd"), 0
        return f"{self.letter}=", {}

    def step(self, action):
        self.turn += 1
        reward = float(action.strip() == self.letter)
        self.letter = self.rng.choice("abcd")
        return f"{self.letter}=", reward, False, self.turn >= 3, {}


def make_echo():
    return Echo()


NOT_CALLABLE = 3


class NoStep:
    def reset(self, *, seed=None, options=None):
        return "x", {}


class Faulty(Echo):
    """Echo whose steps fail by the episode's seed: hang past any short timeout, raise, return
    garbage, or never end (seed % 4 = 0, 1, 2, 3)."""

    def reset(self, *, seed=None, options=None):
        self.mode = seed % 4
        return super().reset(seed=seed)

    def step(self, action):
        import time

        if self.mode == 0:
            time.sleep(2.0)
        if self.mode == 1:
            raise RuntimeError("the simulator crashed")
        if self.mode == 2:
            return "not a step's answer"
        observation, reward, _, _, info = super().step(action)
        return observation, reward, False, False, info


class WhereAmI:
    """Tells the process it runs in (its info), prints to stdout (which must not reach the
    answers a hosting process sends back), and does what its action says: "hang", "exit" (a
    crash of the process), "object" (an answer JSON cannot carry); anything else is echoed."""

    def reset(self, *, seed=None, options=None):
        import os

        print("reset printed this to stdout")
        return f"seed {seed}", {"pid": os.getpid()}

    def step(self, action):
        import os
        import time

        if action == "hang":
            time.sleep(3600)
        if action == "exit":
            os._exit(7)
        if action == "object":
            return object()
        return action, 1.0, False, False, {"pid": os.getpid()}


class BrokenInit:
    def __init__(self):
        raise RuntimeError("no licence for the simulator")

    def reset(self, *, seed=None, options=None):
        return "x", {}

    def step(self, action):
        return "x", 0.0, True, False, {}
