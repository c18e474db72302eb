"""The inline loop (staleness 0): each chunk is filled in next_chunk, on the trainer's own
thread (torch's CPU kernels keep one OpenMP team), with the thread loop's versions, checkpoints
and failures; GRPO at staleness 0 on the thread backend runs this way, its reward calls still
watched, so a hung reward is named."""

import threading

import pytest
import torch

from nostall.algos.grpo import GRPOCommandConfig, GRPOTrainer
from nostall.runtime.queue import RuntimeStopped
from nostall.runtime.thread import RolloutLoop
from nostall.runtime.watchdog import HangError, Watchdog


class _Chunk:
    version = -1
    value = None


def _loop(fill, model, **kwargs):
    return RolloutLoop(
        [_Chunk() for _ in range(2)], fill, model, model, staleness=0, inline=True, **kwargs
    )


def test_chunks_are_filled_on_the_callers_thread_in_order_with_their_versions():
    model = torch.nn.Linear(1, 1)
    threads, filled = [], []

    def fill(chunk):
        threads.append(threading.get_ident())
        filled.append(len(filled))
        chunk.value = filled[-1]

    before = threading.active_count()
    with _loop(fill, model) as loop:
        assert threading.active_count() == before  # no rollout thread
        assert filled == []  # nothing filled before the trainer asks
        for step in range(4):
            index, chunk = loop.next_chunk()
            assert (chunk.value, chunk.version, loop.lag(chunk)) == (step, step, 0)
            loop.release(index)
            with loop.boundary():
                loop.publish(model)
    assert set(threads) == {threading.get_ident()}
    assert loop.chunks_collected == 4


def test_a_second_chunk_before_the_update_is_a_trainer_error_not_a_wait():
    model = torch.nn.Linear(1, 1)
    with _loop(lambda chunk: None, model) as loop:
        loop.next_chunk()
        with pytest.raises(RuntimeError, match="before update 1 was published"):
            loop.next_chunk()


def test_a_failing_fill_stops_the_loop_with_its_cause_at_the_second_call():
    model = torch.nn.Linear(1, 1)
    calls = []

    def fill(chunk):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("reward exploded")

    with pytest.raises(RuntimeStopped, match="reward exploded") as info, _loop(fill, model) as loop:
        index, _ = loop.next_chunk()
        loop.release(index)
        loop.publish(model)
        loop.next_chunk()
    assert isinstance(info.value.__cause__, ValueError) and len(calls) == 2


def test_a_chunk_restored_from_a_checkpoint_is_trained_on_before_a_new_one():
    model = torch.nn.Linear(1, 1)
    with _loop(lambda chunk: setattr(chunk, "value", "new"), model) as loop:
        index, _ = loop.next_chunk()
        loop.release(index)
        with loop.boundary():
            loop.publish(model)
            state = loop.state_dict(lambda chunk: {"value": "saved", "version": 1})
    state["queued"] = [{"value": "queued", "version": 1}]

    def restore(chunk, saved):
        chunk.value, chunk.version = saved["value"], saved["version"]

    resumed = _loop(lambda chunk: setattr(chunk, "value", "new"), model)
    resumed.load_state_dict(state, model, restore)
    with resumed:
        index, chunk = resumed.next_chunk()
        assert chunk.value == "queued"
        resumed.release(index)
        resumed.publish(model)
        _, chunk = resumed.next_chunk()
        assert chunk.value == "new" and chunk.version == 2


def test_inline_needs_staleness_zero():
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="inline fills need staleness 0"):
        RolloutLoop(
            [_Chunk() for _ in range(3)], lambda chunk: None, model, model, staleness=1, inline=True
        )


def test_grpo_at_staleness_zero_generates_on_the_trainers_thread():
    args = GRPOCommandConfig(
        steps=2, num_prompts=2, num_generations=2, staleness=0, watch_syncs=False
    )
    trainer = GRPOTrainer(args=args)
    generator = trainer.setup.generator
    assert trainer.setup.loop.inline and generator.watch_rewards_here
    threads = []
    generate = generator.engine.generate

    def recorded(*a, **k):
        threads.append(threading.get_ident())
        return generate(*a, **k)

    generator.engine.generate = recorded
    trainer.train()
    assert threads and set(threads) == {threading.get_ident()}


def test_a_hung_reward_on_the_trainers_thread_is_named():
    """The inline generator's reward calls run in a helper thread the trainer's watches."""
    args = GRPOCommandConfig(
        steps=2,
        num_prompts=2,
        num_generations=2,
        staleness=0,
        watch_syncs=False,
        reward_timeout=0.3,
    )
    never = threading.Event()

    def stuck(prompts, completions, **kwargs):
        never.wait()

    trainer = GRPOTrainer(reward_funcs=stuck, args=args)
    assert isinstance(trainer.setup.generator.watchdog, Watchdog)
    try:
        with pytest.raises(
            HangError,
            match=r"reward function stuck has not returned .*"
            r"reward_timeout = 0.3 s",
        ):
            trainer.train()
    finally:
        never.set()
