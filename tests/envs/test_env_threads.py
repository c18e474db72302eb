"""Two Python threads on one environment (the ops release the GIL, so their C++ runs at the same
time): steps, asynchronous send/recv and state_dict interleaved. Every call either completes or
refuses with a clear error; the environment is never stepped by two calls at once (run under
ThreadSanitizer by `make sanitize`, which finds the race if the guard slips)."""

import threading

import numpy as np
import torch

import nostall.envs

ALLOWED = ("outstanding", "has not been received", "needs", "twice")


def _hammer(fn, errors, stop, rounds=300):
    for _ in range(rounds):
        if stop.is_set():
            return
        try:
            fn()
        except RuntimeError as e:
            if not any(word in str(e) for word in ALLOWED):
                errors.append(e)
                stop.set()
        except BaseException as e:  # anything else is a bug
            errors.append(e)
            stop.set()


def test_step_send_recv_and_state_dict_from_two_threads():
    env = nostall.envs.make("CartPole-v1", 16, num_threads=2, batch_size=16)
    env.reset(seed=0)
    actions = torch.zeros(16, dtype=torch.long)
    errors: list[BaseException] = []
    stop = threading.Event()

    def stepper():
        env.torch.step(actions)

    def sender():
        env.torch.send(actions)
        env.torch.recv()

    def saver():
        env.state_dict()

    threads = [
        threading.Thread(target=_hammer, args=(f, errors, stop)) for f in (stepper, sender, saver)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    # Drain anything a sender left outstanding, then the environment still steps and saves.
    for _ in range(2):
        try:
            env.torch.recv()
        except RuntimeError:
            break
    obs, *_ = env.step(np.zeros(16, dtype=np.int64))
    assert np.isfinite(obs).all()
    env.load_state_dict(env.state_dict())
    env.close()
