"""Reaching the Ray cluster a run's workers live on: a "host:port" address that does not answer
is an error within seconds (Ray itself would retry it for ever), and a local cluster started for
the run can be kept off the driver's GPU (gpus.py)."""

from __future__ import annotations

import socket

from nostall.runtime.gpus import hidden_from_ray


def probe(address: str | None, timeout_s: float = 5.0) -> None:
    """RuntimeError within `timeout_s` if a "host:port" cluster address does not answer."""
    if address is None or address == "auto" or "://" in address:
        return  # a local cluster, the running one (Ray says if there is none), or a client
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise RuntimeError(f"cannot reach the Ray cluster at {address!r}: {e}") from e


def init_ray(ray, address: str | None, hidden_gpu: str | None) -> None:
    """Joins the cluster at `address` (None: starts a local one without `hidden_gpu`)."""
    probe(address)
    try:
        with hidden_from_ray(hidden_gpu):
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
    except ConnectionError as e:
        raise RuntimeError(f"cannot reach the Ray cluster at {address!r}: {e}") from e
