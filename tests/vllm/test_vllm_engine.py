"""vLLM as the generator (nostall/lm/vllm_engine.py), in float32 on the CPU: its completions are
well formed, its behaviour log-probs are the trainer's on the same weights, weights published
by the trainer reach it once a version, and the run's sampling generator decides its draws
(a resumed run draws what an uninterrupted one would)."""

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.setup import build
from tests.lm.log_probs import generated_and_trainer, trainer_log_probs

pytestmark = pytest.mark.vllm

# float32 on both sides: vLLM's CPU kernels and the trainer's forward differ in operation order
# only (measured: within 5e-7).
ATOL = 1e-5


@pytest.fixture(scope="module")
def run(model_dir):
    args = grpo.GRPOCommandConfig(
        model=str(model_dir),
        generator="vllm",
        dtype="float32",
        staleness=0,
        num_prompts=4,
        num_generations=4,
        max_new_tokens=6,
        learning_rate=1e-3,
        watch_syncs=False,
    )
    setup = build(args)
    yield setup, args
    setup.loop.close()


def _generate(setup, state=None):
    if state is not None:
        setup.generator.load_state_dict(state)
    batch = setup.loop.slots[0]
    setup.generator(batch)
    return batch


def test_completions_are_well_formed(run):
    setup, args = run
    batch = _generate(setup)
    mask, ids = batch.completion_mask, batch.completion_ids
    C = args.max_new_tokens
    lengths = mask.sum(1)
    assert (lengths >= 1).all()
    assert torch.equal(mask, torch.arange(C)[None] < lengths[:, None])  # a prefix of each row
    assert (ids[~mask] == setup.lm.pad_token_id).all()
    assert (batch.log_probs[~mask] == 0).all() and (batch.log_probs[mask] < 0).all()
    eos = setup.lm.eos_token_id
    for row, n in zip(ids.tolist(), lengths.tolist(), strict=True):
        assert eos not in row[: n - 1]  # <eos> ends a completion
        assert n == C or row[n - 1] == eos
    banned = setup.lm.banned_token_ids()
    assert not torch.isin(ids[mask], torch.tensor(banned)).any()
    # Groups share a prompt, and their completions are drawn apart.
    groups = batch.prompt_ids.view(args.num_prompts, args.num_generations, -1)
    assert (groups == groups[:, :1]).all()
    assert len({tuple(r) for r in ids.tolist()}) > args.num_prompts


def test_behaviour_log_probs_are_the_trainers(run):
    setup, args = run
    behaviour, trainer = generated_and_trainer(setup, args)
    torch.testing.assert_close(behaviour, trainer, atol=ATOL, rtol=0)


def test_the_sampling_generator_decides_the_draws(run):
    setup, _ = run
    state = setup.generator.state_dict()
    first = _generate(setup, state).completion_ids.clone()
    again = _generate(setup, state).completion_ids.clone()
    assert torch.equal(first, again)
    assert not torch.equal(_generate(setup).completion_ids, first)  # the stream moved on


def test_published_weights_reach_vllm_once_a_version(run):
    setup, args = run
    engine = setup.generator.engine
    state = setup.generator.state_dict()
    before = _generate(setup, state)
    old_tokens, old_mask = before.completion_ids.clone(), before.completion_mask.clone()
    old_log_probs = before.log_probs[old_mask].sum()
    pushes = engine.pushes
    _generate(setup, state)
    assert engine.pushes == pushes  # the same version: nothing pushed
    with setup.writing(), torch.no_grad():  # an update, as the optimizer writes one
        setup.compute.model.norm.weight.mul_(8.0)  # sharper logits: other draws
    setup.loop.publish(setup.compute)
    setup.loop.refresh()  # the rollout side takes the version, as before a fill
    after = _generate(setup, state)
    assert engine.pushes == pushes + 1
    assert not torch.equal(after.completion_ids, old_tokens)
    new = after.log_probs[after.completion_mask]
    torch.testing.assert_close(new, trainer_log_probs(setup, args, after), atol=ATOL, rtol=0)
    assert not torch.allclose(new.sum(), old_log_probs)
    _generate(setup, state)
    assert engine.pushes == pushes + 1
