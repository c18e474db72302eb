"""RayLoop's checkpoints (ray_loop.py): inside `boundary()` no request is made, the requests in
flight are received, and each worker's side state and weights are read, giving RolloutLoop's
state_dict keys (worker 0's at the top level, every worker's under "workers"), so a one-worker
checkpoint resumes on any transport and any checkpoint resumes exactly here; before `start`, a
checkpoint of any transport is taken in, and applied to the workers once they exist."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nostall.runtime.protocol import LoopState
from nostall.runtime.ray.worker import from_array, to_arrays


class RayCheckpoints:
    """RayLoop's state_dict / load_state_dict and the side state's (fill_state /
    load_fill_state). It reads and sets the loop's request bookkeeping (requested, _seq,
    _ready, _next_index, _lost), its weights (_weights_ref, _weights_version, _published,
    _sender) and its workers."""

    def _worker_states(self) -> list[dict]:
        if not self._held:
            raise RuntimeError("RayLoop's state is taken inside `with boundary():`")
        while self._pending:  # the requests in flight: received now, trained on after resume
            self._receive_one()
        return self._wait_all([w.state.remote() for w in self.workers], "save its state")

    def state_dict(self, clone_slot: Callable[[Any], dict]) -> dict:
        """RolloutLoop.state_dict's keys (worker 0's weights at the top level), every worker's
        state under "workers", the slots filled and not yet trained on in order ("queued")."""
        workers = self._worker_states()
        scratch = self.slots[self._free[-1]]  # a free slot: each queued one is copied out
        queued = []
        for index in sorted(i for i in self._ready if i >= self._next_index):
            result = self._ready[index]
            self._load(scratch, result)
            queued.append({**clone_slot(scratch), "worker": result["worker"], "seq": result["seq"]})
        if self._published is not None:
            # (The trainer's own copy of its last publish: no other copy needed to save it.)
            published = {k: v.cpu() for k, v in self._published.items()}  # sync: saving
        else:
            published = {
                k: from_array(v, self._dtypes[k])
                for k, v in self.ray.get(self._weights_ref).items()
            }
        return LoopState(
            version=self.version,
            rollout_version=workers[0]["rollout_version"],
            chunks_collected=self.requested - len(self._lost),
            rollout_weights=workers[0]["rollout_weights"],
            published_weights=published,
            weights_version=self._weights_version,
            queued=queued,
            workers=workers,
            worker_seq=list(self._seq),
        ).as_dict()

    def fill_state(self) -> dict:
        """Inside `boundary()`: worker 0's side state (each worker's is under "workers")."""
        return self._worker_states()[0]["side"]

    def load_state_dict(
        self, state: dict, trainer_model: torch.nn.Module, restore_slot: Callable[[Any, dict], None]
    ) -> None:
        """Before `start`: a checkpoint of any transport (one worker's weights at the top
        level; a Ray checkpoint's every worker under "workers")."""
        if self.workers:
            raise RuntimeError("load_state_dict must come before the loop starts")
        state = LoopState.from_dict(state).as_dict()  # (checked: every key a LoopState's)
        workers = state.get("workers") or [
            {
                "side": None,
                "rollout_weights": state["rollout_weights"],
                "rollout_version": state["rollout_version"],
            }
        ]
        if len(workers) != self.num_workers:
            raise ValueError(
                f"the checkpoint has {len(workers)} rollout workers, this run {self.num_workers}"
            )
        queued = []
        for saved in state["queued"]:  # restored into a slot, sent as a received result
            scratch = self.slots[0]
            restore_slot(scratch, saved)
            queued.append(
                {
                    "worker": int(saved.get("worker", 0)),
                    "seq": int(saved.get("seq", -1)),
                    "version": int(saved["version"]),
                    "host": scratch.host_state(),
                    "tensors": {
                        k: v.numpy().copy()  # sync: none, a host slot
                        for k, v in scratch.tensors().items()
                    },
                }
            )
        self._resume = {**state, "workers": [dict(w) for w in workers], "queued": queued}
        self.version = int(state["version"])

    def load_fill_state(self, side_state: dict) -> None:
        """Before `start`: worker 0's side state, for a checkpoint that keeps it apart from
        the loop's (a thread or process one)."""
        if self._resume is None:
            raise RuntimeError("load_fill_state comes after load_state_dict")
        if not self._resume["workers"][0].get("side"):
            self._resume["workers"][0]["side"] = side_state

    def _apply_resume(self, state: dict) -> None:
        pairs = zip(self.workers, state["workers"], strict=True)
        self._wait_all([worker.load.remote(saved) for worker, saved in pairs], "load its state")
        self.loss.resumed(state["workers"])
        published = state["published_weights"]
        self._weights_version = int(state["weights_version"])
        if self._sender is not None:
            self._sender.publish(published, self._weights_version)
            self._published = {k: v.clone() for k, v in published.items()}
        else:
            arrays, self._dtypes = to_arrays(published)  # sync: none, a checkpoint's (host)
            self._weights_ref = self.ray.put(arrays)
        self._worker_version = [int(w["rollout_version"]) for w in state["workers"]]
        self.requested = int(state["chunks_collected"])
        self._seq = list(state.get("worker_seq") or [self.requested])
        self._next_index = self.requested - len(state["queued"])
        for i, result in enumerate(state["queued"]):
            self._ready[self._next_index + i] = result
