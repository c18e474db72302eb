"""frozen_heap: objects alive at the start are out of the collector's walks inside the block,
and handed back after it, also when the block raises (a process may run several loops)."""

import gc

import pytest

from nostall.runtime.heap import frozen_heap


def test_frozen_inside_and_handed_back_after_each_block():
    for _ in range(2):
        alive = [[] for _ in range(10)]  # tracked by the collector
        with frozen_heap():
            assert gc.get_freeze_count() >= len(alive)
        assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("the loop failed")
    assert gc.get_freeze_count() == 0
