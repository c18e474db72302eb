"""The native decoder ops over bfloat16 weights (float32 activations, bf16 GEMMs): the training
forward and backward, prefill and decode against the float32 tensor-op path on the same weights
widened (an independent reference); generation's log-probs against the trainer's; opcheck; the
dtype errors; the update by explicit adjoints over bf16 weights and over float32 master weights.
(Before: the native ops took float32 only, and a bf16 model ran every op under autograd.)"""

import copy

import pytest
import torch

from nostall.algos import grpo
from nostall.algos.grpo.explicit_update import ExplicitUpdate
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import GenerationEngine, SamplingConfig
from nostall.lm.models import LanguageModel
from tests.algos.grpo.test_explicit_update import _llama
from tests.lm.architectures import build
from tests.lm.test_decoder_train import _batch, _llama_gqa, _op_args

BF16_U = 2.0**-8  # bf16's unit roundoff (8 significand bits)
LAYERS = 2


def _bound(layers: int, backward: bool = False) -> float:
    """Relative to the reference's largest magnitude: each GEMM rounds both operands to bf16
    (about 2u relative each product), six GEMM-and-reduction stages a layer plus the final
    norm, errors adding along the chain; the backward runs the chain again and rounds its
    weight gradients to bf16 once more."""
    chain = 6 * layers + 1
    return chain * 2 * BF16_U * (2 if backward else 1)


def _bf16(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model in bf16 and the same weights widened to float32 (exactly)."""
    low = copy.deepcopy(model).to(torch.bfloat16)
    return low, copy.deepcopy(low).float()


def _model(which: str, varied_tiny) -> torch.nn.Module:
    if which == "llama_default":  # the default initialisation: well conditioned
        return _llama()
    return varied_tiny[0] if which == "qwen2_tiny" else _llama_gqa()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.abs().max()))


def _close(got: torch.Tensor, want: torch.Tensor, bound: float, what: str) -> None:
    err = _relative(got, want)
    assert err <= bound, f"{what}: {err:.3g} > {bound:.3g} (relative to the largest value)"


def _hidden_and_grads(model, decoder, batch):
    model.zero_grad(set_to_none=True)
    hidden = decoder.grouped_hidden(*batch)
    g = torch.Generator().manual_seed(5)
    (hidden.float() * torch.randn(hidden.shape, generator=g)).sum().backward()
    return hidden.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("which", ["llama_default", "qwen2_tiny", "llama_gqa"])
def test_bf16_training_matches_float32_on_the_same_weights(varied_tiny, which):
    """At the default initialisation within the bound above. The large random weights of the
    other two make attention sharp and the problem ill-conditioned: there bf16 itself moves
    gradients by up to a quarter, and the native path must stay as close as the bf16 tensor
    ops under autograd (what a bf16 model trains with elsewhere) come."""
    low, wide = _bf16(_model(which, varied_tiny))
    batch = _batch(Bp=3, P=5, G=2, C=4)
    native = Decoder(low)
    assert native._native_training_applies()
    hidden, grads = _hidden_and_grads(low, native, batch)
    ops_hidden, ops_grads = _hidden_and_grads(low, Decoder(low, native=False), batch)
    ref_hidden, ref_grads = _hidden_and_grads(wide, Decoder(wide, native=False), batch)
    assert hidden.dtype == torch.float32  # (float32 states over bf16 weights)

    def bound(got_ops: torch.Tensor, ref: torch.Tensor, backward: bool) -> float:
        if which == "llama_default":
            return _bound(LAYERS, backward)
        return 1.5 * _relative(got_ops, ref) + BF16_U

    _close(hidden, ref_hidden, bound(ops_hidden, ref_hidden, False), "hidden")
    assert grads.keys() == ref_grads.keys() == ops_grads.keys()
    for name, grad in grads.items():
        assert grad.dtype == torch.bfloat16, name
        _close(grad, ref_grads[name], bound(ops_grads[name], ref_grads[name], True), name)


@pytest.mark.parametrize("which", ["qwen2_tiny", "llama_gqa"])
def test_bf16_prefill_and_decode_match_float32_on_the_same_weights(varied_tiny, which):
    low, wide = _bf16(_model(which, varied_tiny))
    prompt_ids, prompt_mask, *_ = _batch(Bp=2, P=5, G=1, C=1)  # (logits within the bound)
    G, B, slots = 3, 6, 8
    logits = []
    for decoder in (Decoder(low), Decoder(wide, native=False)):
        decoder.freeze()
        cache = decoder.new_cache(B, slots)
        assert cache.keys.dtype == torch.float32  # (the native ops' cache, over bf16 too)
        with torch.no_grad():
            assert decoder._native_applies() == (decoder.model is low)
            first = decoder.prefill(prompt_ids, prompt_mask, cache, G)
            slot_mask = torch.zeros(B, slots, dtype=torch.bool)
            slot_mask[:, :5] = prompt_mask.repeat_interleave(G, 0)
            slot_mask[:, 5] = True
            token = torch.arange(3, 3 + B)
            position = prompt_mask.sum(1).repeat_interleave(G, 0)
            second = decoder.decode(token, position, torch.tensor([5]), slot_mask, cache)
        logits.append((first, second))
    (first, second), (ref_first, ref_second) = logits
    assert first.dtype == second.dtype == torch.float32
    _close(first, ref_first, _bound(LAYERS), "prefill logits")
    _close(second, ref_second, _bound(LAYERS), "decode logits")


def test_bf16_generation_log_probs_are_the_trainers(varied_tiny):
    """Generation and the trainer run the same arithmetic (float32 between bf16 GEMMs): the
    behaviour log-probs agree with the trainer's to float32 reduction-order differences."""
    low, _ = _bf16(varied_tiny[0])
    decoder = Decoder(low)
    B, P, C, G = 6, 5, 4, 3
    engine = GenerationEngine(
        decoder,
        SamplingConfig(max_new_tokens=C),
        eos_token_id=2,
        pad_token_id=0,
        banned_token_ids=[],
    )
    batch = LMBatch.empty(B, P, C)
    prompt_ids, prompt_mask, *_ = _batch(Bp=2, P=P, G=1, C=1)
    batch.prompt_ids.copy_(prompt_ids.repeat_interleave(G, 0))
    batch.prompt_mask.copy_(prompt_mask.repeat_interleave(G, 0))
    engine.generate(batch, torch.Generator().manual_seed(0), group_size=G)
    with torch.no_grad():
        trainer = grpo.policy_log_probs(decoder, batch, 1.0, None, G)
    mask = batch.completion_mask
    assert mask.any()
    gap = (trainer - batch.log_probs)[mask].abs().max()
    assert gap < 1e-3, gap


def test_bf16_native_ops_pass_opcheck(varied_tiny):
    low, _ = _bf16(varied_tiny[0])
    decoder = Decoder(low)
    batch = _batch(Bp=2, P=4, G=2, C=3)
    args = list(_op_args(decoder, batch))
    for i in (4, 12):  # embed and final_norm ask for gradients
        args[i] = args[i].clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.nostall.decoder_train.default, tuple(args))
    decoder.freeze()
    cache = decoder.new_cache(4, 8)
    prompt_ids, prompt_mask = batch[0], batch[1]
    weights = decoder._weight_lists()
    config = decoder._native_config()
    generation_checks = ("test_schema", "test_faketensor")  # (no gradient: as in float32)
    torch.library.opcheck(
        torch.ops.nostall.prefill_prompts.default,
        (prompt_ids, prompt_mask, 2, *weights, cache.keys, cache.values, *config),
        test_utils=generation_checks,
    )
    slot_mask = torch.zeros(4, 8, dtype=torch.bool)
    slot_mask[:, :5] = True
    torch.library.opcheck(
        torch.ops.nostall.decode_step.default,
        (
            torch.arange(3, 7),
            torch.full((4,), 4),
            torch.tensor([4]),
            slot_mask,
            *weights,
            cache.keys,
            cache.values,
            *config,
        ),
        test_utils=generation_checks,
    )


def test_mixed_or_unsupported_dtypes_are_named(varied_tiny):
    low, _ = _bf16(varied_tiny[0])
    decoder = Decoder(low)
    batch = _batch(Bp=2, P=4, G=2, C=3)
    args = list(_op_args(decoder, batch))
    op = torch.ops.nostall.decoder_train.default
    mixed = list(args)
    mixed[6] = [mixed[6][0].float(), *mixed[6][1:]]  # one layer's q/k/v weight in float32
    with pytest.raises(RuntimeError, match=r"qkv_weight must be BFloat16, got Float"):
        op(*mixed)
    low_tables = list(args)
    low_tables[13] = low_tables[13].bfloat16()  # cos: the tables stay float32
    with pytest.raises(RuntimeError, match="cos must be Float, got BFloat16"):
        op(*low_tables)
    half = list(args)
    half[4] = half[4].half()
    with pytest.raises(RuntimeError, match="embed must be float32 or bfloat16, got Half"):
        op(*half)
    # A bf16 cache for the native decode step is refused by name (the cache is float32).
    decoder.freeze()
    weights, config = decoder._weight_lists(), decoder._native_config()
    keys = torch.zeros(2, 2, 4, 8, 4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="keys must be Float, got BFloat16"):
        torch.ops.nostall.prefill_prompts.default(
            batch[0], batch[1], 1, *weights, keys, keys.clone(), *config
        )


def _llama_dir_args(**settings) -> grpo.GRPOCommandConfig:
    return grpo.GRPOCommandConfig(
        num_prompts=2,
        num_generations=4,
        max_new_tokens=4,
        watch_syncs=False,
        staleness=0,
        **settings,
    )


@pytest.mark.parametrize("master_dtype", ["float32", "bfloat16"])
def test_the_explicit_update_runs_bf16_compute(master_dtype):
    """bf16 compute takes the update by explicit adjoints, over bf16 weights (all in bf16) and
    over float32 master weights (MasterWeights' bf16 gradient buffer); the step matches the
    autograd path's exactly (tests/lm/test_precision.py checks the master-weight step against an
    independent float32 step)."""
    model, tokenizer = build("llama")
    args = _llama_dir_args(
        dtype="bfloat16", master_dtype=master_dtype, entropy_coef=0.0, learning_rate=1e-2
    )
    runs = []
    for autograd in (False, True):
        setup = grpo.build(
            args, grpo.Inputs(lm=LanguageModel(copy.deepcopy(model), tokenizer, "llama"))
        )
        assert ExplicitUpdate.applies(setup.decoder, setup.stepper, None)
        batch = setup.loop.slots[0]
        torch.manual_seed(0)
        setup.generator(batch)
        grpo.grpo_update(
            grpo.UpdateContext(
                setup.decoder,
                setup.stepper,
                args,
                setup.vocab,
                setup.group_index,
                autograd=autograd,
            ),
            batch,
            setup.corrects,
        )
        runs.append({n: p.detach().clone() for n, p in setup.lm.model.named_parameters()})
    explicit, autograd = runs
    before = dict(model.named_parameters())
    moved = [n for n, p in explicit.items() if not torch.equal(p, before[n].to(p.dtype))]
    assert len(moved) == len(explicit)  # (a step that moved nothing would prove nothing)
    for name, p in explicit.items():  # the same native ops: the same gradients, bit for bit
        assert torch.equal(p, autograd[name]), name
