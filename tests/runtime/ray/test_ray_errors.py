"""The Ray backend's errors before any cluster is joined (no Ray cluster runs in this file)."""

import time

import pytest

from nostall.algos import ppo

pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")

FAST = dict(watch_syncs=False, log_interval=1)


def test_an_unreachable_cluster_is_an_error_within_seconds():
    """Ray itself retries an address that does not answer for ever; the run says so at once."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=f"cannot reach the Ray cluster at '127.0.0.1:{port}'"):
        ppo.train(ppo.PPOConfig(backend="ray", ray_address=f"127.0.0.1:{port}", **FAST))
    assert time.perf_counter() - start < 10
