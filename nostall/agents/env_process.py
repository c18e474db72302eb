"""Text environments in processes of their own (env_isolation="process"), for environment code
the user does not want in the trainer's process: each environment instance lives in a host
process (env_host.py) that the trainer talks to in JSON lines, so a call that hangs past its
timeout is ended by killing its process (a thread cannot be stopped), a crash or a runaway
allocation costs that process alone, and nothing it returns is unpickled here.

A pool holds one host a concurrent episode, started on first use and kept across batches (an
episode's reset makes its environment fresh). A host that timed out, crashed or answered
garbage is killed and replaced at its next use. The pool kills every host when it is closed or
collected, and at exit; a host whose parent dies ends by itself."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

from nostall.agents.text_env import EnvError

_HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "env_host.py")


@dataclass(frozen=True)
class HostedEnv:
    """What a host builds: `spec` ("module:Class", or "file.py:Class" for a built-in) called
    with `kwargs` (JSON)."""

    spec: str
    kwargs: dict = field(default_factory=dict)


class _Host:
    """One host process and its environment; calls come from one thread at a time (an
    episode's)."""

    def __init__(self, env: HostedEnv, timeout_s: float | None):
        self.env, self.timeout_s = env, timeout_s
        self.process: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def call(self, request: dict):
        with self._lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
            self._send(request)
            return self._answer(f"{request['op']}()")

    def _start(self) -> None:
        self.kill()
        settings = json.dumps({"spec": self.env.spec, "kwargs": self.env.kwargs})
        self.process = subprocess.Popen(
            [sys.executable, _HOST, settings],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # (a Ctrl-C in the terminal reaches the trainer alone)
        )
        self._buffer = b""
        self._answer(f"starting {self.env.spec}")  # its constructor's outcome

    def _send(self, request: dict) -> None:
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError:  # (a broken pipe: its process ended)
            raise EnvError(f"the environment's process ended ({self._ended()})") from None

    def _answer(self, what: str):
        """The next answer line, within timeout_s; past it the process is killed."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        out = self.process.stdout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.kill()
                raise TimeoutError(
                    f"{what}: no answer within tool_timeout {self.timeout_s} s (its process "
                    "was killed)"
                )
            ready, _, _ = select.select([out], [], [], left)
            if ready:
                chunk = os.read(out.fileno(), 1 << 16)
                if not chunk:  # (its process ended: its exit code named)
                    raise EnvError(f"{what}: the environment's process ended ({self._ended()})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            self.kill()
            raise EnvError(f"{what}: the environment's process answered garbage") from None
        if "error" in answer:
            if what.startswith("starting"):
                self.kill()
            raise EnvError(f"{what} raised {answer['error']}")
        return answer.get("value")

    def _ended(self) -> str:
        """How the process that closed its answers ended (waited for a moment, then killed)."""
        try:
            code = self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        return "no exit code: killed" if code is None else f"exit code {code}"

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait()
            for stream in (process.stdin, process.stdout):
                stream.close()


class HostedEnvProxy:
    """An environment with Gymnasium's reset and step, served by a host of the pool."""

    def __init__(self, host: _Host):
        self._host = host

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        value = self._host.call({"op": "reset", "seed": seed, "options": options})
        return tuple(value) if isinstance(value, list) else value

    def step(self, action: str):
        value = self._host.call({"op": "step", "action": action})
        return tuple(value) if isinstance(value, list) else value


class EnvProcessPool:
    """`size` hosts of `env`, handed out in turn by `make_env()`: a batch of at most `size`
    episodes gets one each."""

    def __init__(self, env: HostedEnv, size: int, timeout_s: float | None):
        self.hosts = [_Host(env, timeout_s) for _ in range(size)]
        self._next = 0
        self._closer = weakref.finalize(self, _kill_all, self.hosts)  # (and at exit)

    def make_env(self) -> HostedEnvProxy:
        host = self.hosts[self._next % len(self.hosts)]
        self._next += 1
        return HostedEnvProxy(host)

    def close(self) -> None:
        self._closer()


# A process's pools by what they host: the prompt stream (reset observations) and the episodes
# of one run share one; a run dropped takes its pool (and its processes) with it.
_POOLS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def process_pool(env: HostedEnv, size: int, timeout_s: float | None) -> EnvProcessPool:
    """This process's pool of `size` hosts of `env` (one made where there is none)."""
    key = (env.spec, json.dumps(env.kwargs, sort_keys=True), size, timeout_s)
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = EnvProcessPool(env, size, timeout_s)
    return pool


def _kill_all(hosts: list[_Host]) -> None:
    for host in hosts:
        host.kill()
