"""The one factory that chooses a transport by name (nostall/runtime/transports.py): each name
gives its transport, an unknown one is refused naming the argument, a side that can only be
built beside the trainer is refused where it would have to be built anew, and a side built
beside the trainer is tied to its loop as a process's or worker's is to theirs."""

import pytest
import torch

from nostall.runtime.process.loop import ProcessLoop
from nostall.runtime.thread import RolloutLoop
from nostall.runtime.transports import (
    BACKENDS,
    SideRecipe,
    TransportOptions,
    check_backend,
    open_transport,
)
from nostall.runtime.watchdog import Watchdog


class Slot:
    version = -1

    def tensors(self):
        return {"x": torch.zeros(2)}


class Side:
    """A fill with every optional hook a transport may set or call."""

    def __init__(self):
        self.model = torch.nn.Linear(2, 2)
        self.watchdog = None
        self.refresh = None
        self.attached = []

    def __call__(self, chunk):
        pass

    def attach(self, loop):
        self.attached.append(loop)

    def stats(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _side(worker: int = 0) -> Side:
    return Side()


def _open(backend, recipe=None, **options):
    recipe = recipe or SideRecipe(_side, _side)
    slots = [Slot() for _ in range(options.get("staleness", 0) + 2)]
    return open_transport(
        backend, slots, recipe, torch.nn.Linear(2, 2), TransportOptions(**options)
    )


def test_each_name_gives_its_transport():
    assert BACKENDS == ("thread", "process", "ray")
    assert isinstance(_open("thread"), RolloutLoop)
    assert isinstance(_open("process"), ProcessLoop)  # (not started: no child yet)


def test_the_ray_name_gives_the_ray_loop():
    pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")
    from nostall.runtime.ray.loop import RayLoop

    assert isinstance(_open("ray"), RayLoop)  # (not started: no cluster reached)


@pytest.mark.parametrize("name", ["gpu", "Thread", "", "threads"])
def test_an_unknown_name_is_refused_naming_the_argument(name):
    with pytest.raises(ValueError, match=f"backend must be thread, process or ray, got {name!r}"):
        _open(name)
    with pytest.raises(ValueError, match="--backend must be"):
        check_backend(name, "--backend")


@pytest.mark.parametrize("backend", ["process", "ray"])
def test_a_side_only_buildable_beside_the_trainer_is_refused_elsewhere(backend):
    with pytest.raises(ValueError, match="can only be built beside the trainer"):
        _open(backend, SideRecipe(_side, None))


def test_a_side_beside_the_trainer_is_watched_attached_and_refreshed_by_its_loop():
    loop = _open("thread", inflight=True)
    side = loop._fill
    assert isinstance(side.watchdog, Watchdog) and loop.watchdog is side.watchdog
    assert side.attached == [loop]
    assert side.refresh == loop.refresh
    plain = _open("thread")._fill
    assert plain.refresh is None  # in-flight swaps only when asked for


def test_a_side_without_the_optional_hooks_is_left_as_it_is():
    class Bare:
        def __init__(self):
            self.model = torch.nn.Linear(2, 2)

        def __call__(self, chunk):
            pass

    loop = _open("thread", SideRecipe(Bare, None))
    assert loop.watchdog is None and not hasattr(loop._fill, "watchdog")


def test_inline_fills_need_staleness_0():
    with pytest.raises(ValueError, match="inline fills need staleness 0"):
        _open("thread", staleness=1, inline=True)
