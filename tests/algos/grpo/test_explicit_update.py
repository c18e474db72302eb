"""The GRPO update by explicit adjoints (nostall/algos/grpo/explicit_update.py) against the same
update through autograd: every parameter and the metrics after several steps, on Qwen2 (tied output
weight, q/k/v biases) and Llama (grouped-query attention, untied output weight, no biases), with
and without banned tokens, each loss type, a temperature, several optimizer steps per batch, the
decoupled objective and an entropy bonus; the flat layout it relies on; and checkpoints of the
older layout."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nostall.algos import grpo
from nostall.algos.grpo import setup as grpo_setup
from nostall.algos.grpo import state as grpo_state
from nostall.algos.grpo.explicit_update import ExplicitUpdate, training_order
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.models import builtin_model
from nostall.optim import ClippedAdam

# float32; the two paths run the same ops but for the gradient's accumulation order.
RTOL, ATOL = 1e-4, 1e-6
EOS = 5


def _llama(tied: bool = False) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=22,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _batch(Bp: int, G: int, P: int = 6, C: int = 4, seed: int = 0) -> LMBatch:
    g = torch.Generator().manual_seed(seed)
    batch = LMBatch.empty(Bp * G, P, C)
    batch.prompt_ids.copy_(torch.randint(3, 22, (Bp, P), generator=g).repeat_interleave(G, 0))
    batch.prompt_mask.fill_(True)
    batch.prompt_mask[:G, :2] = False  # the first group's prompt is left-padded
    batch.completion_ids.copy_(torch.randint(3, 22, (Bp * G, C), generator=g))
    batch.completion_mask.fill_(True)
    batch.completion_mask[0, 2:] = False
    batch.loss_mask.copy_(batch.completion_mask)
    batch.log_probs.copy_(torch.rand(Bp * G, C, generator=g).log() - 1.0)
    batch.rewards.copy_(torch.rand(Bp * G, generator=g))
    return batch


def _run(model, args: grpo.GRPOCommandConfig, banned: list[int], autograd: bool, steps: int = 3):
    decoder = Decoder(model)
    order = training_order(decoder)
    optimizer = ClippedAdam(order, lr=args.learning_rate, max_grad_norm=args.max_grad_norm)
    assert ExplicitUpdate.applies(decoder, optimizer, None)
    vocab = SampledVocab.build(22, banned)
    group_index = torch.arange(args.num_prompts).repeat_interleave(args.num_generations)
    metrics = []
    for step in range(steps):
        batch = _batch(args.num_prompts, args.num_generations, seed=step)
        batch.completion_ids[::3, -1] = EOS  # (some rows end with <eos>, the others are cut)
        out = grpo.grpo_update(
            grpo.UpdateContext(
                decoder, optimizer, args, vocab, group_index, eos_token_id=EOS, autograd=autograd
            ),
            batch,
            step > 0,
        )
        metrics.append(torch.stack(list(out.values())))
    return dict(model.named_parameters()), torch.stack(metrics)


@pytest.mark.parametrize("which", ["qwen2_tiny", "llama_untied"])
@pytest.mark.parametrize(
    ("loss_type", "temperature", "updates", "banned", "entropy_coef", "mode"),
    [
        ("dapo", 1.0, 1, [0, 1], 0.0, "token_truncate"),
        ("grpo", 0.7, 2, [], 0.0, "sequence_mask"),
        ("dr_grpo", 1.3, 1, [1], 0.1, "token_truncate"),
        ("bnpo", 1.0, 2, [0, 1], 0.0, "token_mask"),
        ("dapo", 0.7, 2, [0, 1], 0.05, "sequence_truncate"),
        ("grpo", 1.0, 1, [1], 0.2, "token_truncate"),
    ],
)
def test_explicit_update_matches_autograd(
    which, loss_type, temperature, updates, banned, entropy_coef, mode
):
    """The update by explicit adjoints against autograd's, over three steps (the later two
    decoupled: weighted by the behaviour weight of each of TRL's modes)."""
    model = builtin_model("tiny", seed=3).model if which == "qwen2_tiny" else _llama()
    args = grpo.GRPOCommandConfig(
        num_prompts=3,
        num_generations=4,
        max_new_tokens=4,
        loss_type=loss_type,
        temperature=temperature,
        updates_per_batch=updates,
        learning_rate=1e-2,
        max_grad_norm=0.5,
        is_cap=1.5,
        entropy_coef=entropy_coef,
        vllm_importance_sampling_mode=mode,
    )
    mine, mine_metrics = _run(copy.deepcopy(model), args, banned, autograd=False)
    theirs, their_metrics = _run(copy.deepcopy(model), args, banned, autograd=True)
    for name, p in theirs.items():
        torch.testing.assert_close(mine[name], p, rtol=RTOL, atol=ATOL, msg=name)
    torch.testing.assert_close(mine_metrics, their_metrics, rtol=RTOL, atol=ATOL, equal_nan=True)
    # And the parameters moved: the comparison is not of two untouched models.
    assert not torch.equal(theirs["model.norm.weight"], model.model.norm.weight)


@pytest.mark.parametrize(
    ("micro", "accumulate", "mask_truncated", "loss_type"),
    [
        (2, 2, False, "grpo"),
        (2, 1, False, "dapo"),
        (4, 2, True, "dr_grpo"),
        (1, 1, True, "dapo"),
    ],
)
def test_micro_batches_and_masked_truncation_match_autograd(
    micro, accumulate, mask_truncated, loss_type
):
    """TRL's micro-batches (steps_per_generation), gradient accumulation and
    mask_truncated_completions: the explicit update against autograd, two passes a batch."""
    args = grpo.GRPOCommandConfig(
        num_prompts=4,
        num_generations=3,
        max_new_tokens=4,
        loss_type=loss_type,
        updates_per_batch=2,
        learning_rate=1e-2,
        steps_per_generation=micro,
        gradient_accumulation_steps=accumulate,
        mask_truncated_completions=mask_truncated,
        entropy_coef=0.1,
    )
    model = builtin_model("tiny", seed=3).model
    mine, mine_metrics = _run(copy.deepcopy(model), args, [0, 1], autograd=False)
    theirs, their_metrics = _run(copy.deepcopy(model), args, [0, 1], autograd=True)
    # Up to 12 optimizer steps at lr 1e-2: the k biases' true gradient is zero (softmax does
    # not see a shift of every key), and Adam scales their rounding noise up to lr-sized steps,
    # which the later steps carry on: parameters agree to 1e-4, not 1e-6.
    for name, p in theirs.items():
        torch.testing.assert_close(mine[name], p, rtol=RTOL, atol=1e-4, msg=name)
    torch.testing.assert_close(mine_metrics, their_metrics, rtol=1e-3, atol=1e-4, equal_nan=True)


def test_the_fused_weights_are_views_of_the_optimizers_buffer():
    """Each layer's q/k/v (bias) and gate/up weights are one view of the flat parameters, so
    an optimizer step shows through them with no copy."""
    decoder = Decoder(builtin_model("tiny").model)
    optimizer = ClippedAdam(training_order(decoder), lr=1e-3, max_grad_norm=1.0)
    update = ExplicitUpdate(decoder, optimizer)
    for layer, qkv, bias, gate_up in zip(
        decoder.layers, update.qkv, update.qkv_bias, update.gate_up, strict=True
    ):
        attn, mlp = layer.self_attn, layer.mlp
        assert torch.equal(
            qkv, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        )
        assert torch.equal(bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        assert torch.equal(gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        assert qkv.data_ptr() == attn.q_proj.weight.data_ptr()
        assert gate_up.data_ptr() == mlp.gate_proj.weight.data_ptr()


def test_it_does_not_apply_where_its_layout_or_path_is_missing():
    decoder = Decoder(builtin_model("tiny").model)
    in_model_order = ClippedAdam(decoder.model.parameters(), lr=1e-3, max_grad_norm=1.0)
    assert not ExplicitUpdate.applies(decoder, in_model_order, None)
    in_its_order = ClippedAdam(training_order(decoder), lr=1e-3, max_grad_norm=1.0)
    assert not ExplicitUpdate.applies(decoder, in_its_order, decoder)  # a KL reference
    assert not ExplicitUpdate.applies(Decoder(decoder.model, native=False), in_its_order, None)
    assert not ExplicitUpdate.applies(decoder, torch.optim.Adam(decoder.model.parameters()), None)


@pytest.mark.parametrize("k", [1, 2])
def test_a_checkpoint_in_the_older_parameter_order_restores_each_moment_to_its_parameter(k):
    """Checkpoints before the explicit update kept the optimizer in the model's parameter order;
    a resume maps each parameter's moments to it by name (from the k-th of several saves)."""
    args = grpo.GRPOCommandConfig(
        steps=4, num_prompts=2, num_generations=4, staleness=0, watch_syncs=False
    )
    setup = grpo_setup.build(args)
    batch = setup.loop.slots[0]
    group_index = setup.group_index
    saves = []
    for _ in range(2):
        setup.generator(batch)
        grpo.grpo_update(
            grpo.UpdateContext(setup.decoder, setup.optimizer, args, setup.vocab, group_index),
            batch,
            False,
        )
        saves.append(grpo_state.snapshot(setup, 1, grpo.GRPOResult(args={})))
    state = saves[k - 1]
    names = grpo_state._optimizer_names(setup)
    assert names != [n for n, _ in setup.lm.model.named_parameters()]  # the orders differ
    # The same state as the older layout wrote it: entries in named_parameters order, no names.
    older = copy.deepcopy(state)
    where = {name: i for i, name in enumerate(names)}
    older["optimizer"]["state"] = {
        i: state["optimizer"]["state"][where[name]]
        for i, (name, _) in enumerate(setup.lm.model.named_parameters())
    }
    del older["optimizer_parameters"]
    for saved in (state, older):
        fresh = grpo_setup.build(args)
        grpo_state.restore(fresh, saved, grpo.GRPOResult(args={}))
        expected = {
            n: setup.optimizer.state[p]["exp_avg"] for n, p in setup.lm.model.named_parameters()
        }
        if k == 1:  # the first save's moments, not the live ones
            expected = {n: state["optimizer"]["state"][where[n]]["exp_avg"] for n in names}
        for name, p in fresh.lm.model.named_parameters():
            torch.testing.assert_close(
                fresh.optimizer.state[p]["exp_avg"], expected[name], rtol=0, atol=0, msg=name
            )


def test_packed_parameters_make_the_generators_fused_weights_views():
    """pack_parameters lays a generation copy's parameters end to end: the fused weights are
    views (a refresh copies nothing and sees weights loaded later), and generation is unchanged."""
    from nostall.lm.generation import Completions, GenerationEngine, SamplingConfig
    from nostall.lm.packing import pack_parameters

    lm = builtin_model("tiny", seed=2)
    plain, packed = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    decoders = [Decoder(plain), Decoder(packed)]
    assert pack_parameters(decoders[1])
    decoders[1].freeze()
    attn = packed.model.layers[0].self_attn
    assert decoders[1]._fused[0][0].data_ptr() == attn.q_proj.weight.data_ptr()
    with torch.no_grad():  # new weights, loaded in place as a weight pull does
        for p in packed.parameters():
            p.add_(0.01)
        for p in plain.parameters():
            p.add_(0.01)
    outs = []
    for decoder in decoders:
        engine = GenerationEngine(
            decoder,
            SamplingConfig(max_new_tokens=4),
            eos_token_id=lm.eos_token_id,
            pad_token_id=lm.pad_token_id,
            banned_token_ids=lm.banned_token_ids(),
        )
        enc = lm.tokenizer(["abc=", "hh="], padding=True, return_tensors="pt", padding_side="left")
        batch = Completions.empty(4, enc.input_ids.shape[1], 4)
        batch.prompt_ids.copy_(enc.input_ids.repeat_interleave(2, 0))
        batch.prompt_mask.copy_(enc.attention_mask.bool().repeat_interleave(2, 0))
        engine.generate(batch, torch.Generator().manual_seed(0), 2)
        outs.append((batch.completion_ids, batch.log_probs))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])
