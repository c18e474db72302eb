"""In-flight weight swaps: weights published while a batch is being generated are taken between
two decode steps, the keys and values already cached kept (as PipelineRL does), each token's
policy version recorded.

Checked against transformers itself (the same swap made in the middle of its own cached greedy
decode), on the runtime's loop (a chunk keeps the version it started with), and through GRPO's
generator with the trainer's publish placed deterministically inside a batch."""

import dataclasses
import threading

import pytest
import torch
from transformers import DynamicCache

from nostall.algos import grpo
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import Completions, GenerationEngine, SamplingConfig, positions_of
from nostall.lm.models import builtin_model
from nostall.runtime.thread import RolloutLoop

PROMPTS = ["efffb=", "abc=", "h=", "0123="]
C = 8


def _random_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(v.shape, generator=g) * 0.3 if v.dim() > 1 else v.clone()
        for k, v in model.state_dict().items()
    }


def _batch(lm):
    enc = lm.tokenizer(PROMPTS, padding=True, return_tensors="pt", padding_side="left")
    batch = Completions.empty(*enc.input_ids.shape, C)
    batch.prompt_ids.copy_(enc.input_ids)
    batch.prompt_mask.copy_(enc.attention_mask.bool())
    return batch


def _transformers_greedy_with_swap(model, before, after, ids, mask, swap_at):
    """transformers' own cached greedy decode, `after`'s weights loaded before the forward whose
    logits pick token `swap_at`; the cache of the earlier tokens kept."""
    model.load_state_dict(before)
    cache = DynamicCache()
    attention = mask.long()
    next_position = mask.sum(1)
    tokens = []
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions_of(mask),
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        for t in range(C):
            tokens.append(logits.argmax(-1))
            if t == C - 1:
                break
            if t + 1 == swap_at:
                model.load_state_dict(after)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
            logits = model(
                input_ids=tokens[-1][:, None],
                attention_mask=attention,
                position_ids=(next_position + t)[:, None],
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
    return torch.stack(tokens, 1)


@pytest.mark.parametrize("swap_at", [1, 3])
def test_a_swap_between_decode_steps_matches_transformers_doing_the_same(swap_at):
    lm = builtin_model("tiny", seed=0)
    model = lm.model.eval()
    before, after = _random_weights(model, 1), _random_weights(model, 2)
    batch = _batch(lm)
    expected = _transformers_greedy_with_swap(
        model, before, after, batch.prompt_ids, batch.prompt_mask, swap_at
    )
    model.load_state_dict(before)
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=C, top_k=1),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=[],
    )
    calls = []

    def between_tokens(t):
        calls.append(t)
        if t != swap_at:
            return False
        with torch.no_grad():  # as the rollout loop's pull: in place, into the same tensors
            for name, value in model.state_dict().items():
                value.copy_(after[name])
        return True

    engine.generate(batch, torch.Generator().manual_seed(0), 1, between_tokens)
    assert calls == list(range(1, C))
    # Each row up to its first <eos> (after it the engine pads and transformers goes on).
    ended = (expected == lm.eos_token_id).long().cumsum(1)
    live = (ended - (expected == lm.eos_token_id).long()) == 0
    assert live[:, swap_at:].any()  # the swap changes tokens that count
    assert torch.equal(batch.completion_ids[live], expected[live])
    # And the swap did matter: the old weights alone decode otherwise.
    no_swap = _transformers_greedy_with_swap(
        model, before, before, batch.prompt_ids, batch.prompt_mask, swap_at
    )
    assert not torch.equal(no_swap[live], expected[live])


def test_a_swap_to_the_same_weights_changes_nothing():
    lm = builtin_model("tiny", seed=0)
    model = lm.model.eval()
    model.load_state_dict(_random_weights(model, 1))
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=C),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=lm.banned_token_ids(),
    )
    plain, swapped = _batch(lm), _batch(lm)
    engine.generate(plain, torch.Generator().manual_seed(5), 1)
    engine.generate(swapped, torch.Generator().manual_seed(5), 1, lambda t: True)
    for name, value in plain.tensors().items():
        assert torch.equal(value, swapped.tensors()[name]), name


class _Chunk:
    version = -1


def test_the_loops_refresh_takes_weights_published_mid_chunk():
    """Staleness 1: chunk 1 is generated while the trainer trains chunk 0 and publishes; the
    fill takes the new weights midway, and the chunk keeps the version it started with."""
    trainer_model, rollout_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    rollout_model.load_state_dict(trainer_model.state_dict())
    reached, published = threading.Event(), threading.Event()
    filled = []

    def fill(chunk):
        chunk.seen = [loop.refresh()]  # nothing newer yet: no change
        if len(filled) == 1:
            reached.set()
            assert published.wait(10)
            chunk.seen += [loop.refresh(), loop.refresh()]  # the second finds nothing newer
            chunk.weight = rollout_model.weight.detach().clone()
        filled.append(chunk)

    loop = RolloutLoop(
        [_Chunk() for _ in range(3)], fill, rollout_model, trainer_model, staleness=1
    )
    with loop:
        index, first = loop.next_chunk()
        assert first.version == 0 and first.seen == [0]
        with torch.no_grad():
            trainer_model.weight.fill_(1.5)
        loop.release(index)
        assert reached.wait(10)  # chunk 1 is in flight, at version 0
        loop.publish(trainer_model)
        published.set()
        index, second = loop.next_chunk()
        assert second.version == 0  # its start; the bound counts from there
        assert second.seen == [0, 1, 1]
        assert torch.equal(second.weight, torch.full((2, 2), 1.5))
        assert loop.lag(second) == 1
        loop.release(index)


def test_grpo_generator_records_each_tokens_version():
    """The trainer publishes version 1 while batch 1 is at its third token: tokens 2.. carry
    version 1, the batch version 0, and the mean token lag counts each token's."""
    args = grpo.GRPOCommandConfig(
        steps=2,
        num_prompts=2,
        num_generations=2,
        max_new_tokens=5,
        staleness=1,
        inflight_weights=True,
        watch_syncs=False,
    )
    run = grpo.build(args)
    loop, generator = run.loop, run.generator
    refresh = generator.refresh
    reached, published = threading.Event(), threading.Event()
    calls = {"n": 0}
    per_batch = args.max_new_tokens  # one at the batch's start, one before each decode step

    def held_up_refresh():
        calls["n"] += 1
        if calls["n"] == per_batch + 3:  # batch 1, before the step whose logits pick token 2
            reached.set()
            assert published.wait(10)
        return refresh()

    generator.refresh = held_up_refresh
    with loop:
        index, first = loop.next_chunk()
        assert first.version == 0 and first.token_versions == [0] * 5
        grpo.grpo_update(
            grpo.UpdateContext(run.decoder, run.optimizer, args, run.vocab, run.group_index),
            first,
            True,
        )
        loop.release(index)
        assert reached.wait(10)
        loop.publish(run.lm.model)
        published.set()
        index, second = loop.next_chunk()
        assert second.version == 0
        assert second.token_versions == [0, 0, 1, 1, 1]
        assert second.mean_token_lag(loop.version) == pytest.approx(1 - 3 / 5)
        assert generator.swaps == 1
        # The rollout copy now holds the trainer's published weights.
        for name, value in run.lm.model.state_dict().items():
            assert torch.equal(loop.rollout_model.state_dict()[name], value), name
        # A checkpoint of a queued batch keeps its token versions.
        copy = LMBatch.empty(4, second.prompt_ids.shape[1], 5)
        copy.load_state_dict(second.state_dict())
        assert copy.token_versions == second.token_versions
        loop.release(index)


def test_a_run_with_inflight_weights_reports_its_token_lag():
    args = grpo.GRPOCommandConfig(
        steps=6,
        num_prompts=4,
        num_generations=4,
        staleness=1,
        inflight_weights=True,
        watch_syncs=False,
        log_interval=3,
    )
    result = grpo.train(args)
    assert len(result.rewards) == 6
    assert 0 <= result.mean_token_lag <= result.mean_lag <= 1
    off = grpo.train(dataclasses.replace(args, inflight_weights=False))
    assert off.weight_swaps == 0 and off.mean_token_lag == off.mean_lag


def test_inflight_weights_need_staleness():
    with pytest.raises(ValueError, match="--inflight-weights needs --staleness of at least 1"):
        grpo.GRPOCommandConfig(inflight_weights=True, staleness=0).check()
