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
