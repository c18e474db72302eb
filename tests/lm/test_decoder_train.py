"""`nostall::decoder_train` (the native training forward and backward of the grouped batch)
against the decoder's tensor-op `grouped_hidden` under autograd: hidden states and the gradient
of every parameter, on Qwen2 (q/k/v biases, the built-in tiny model) and Llama with grouped-query
attention (no biases); padded prompts and ended completions; opcheck; every bad argument."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nostall.lm.decoder import Decoder
from tests.lm.tolerances import chained_sum_atol

# float32 throughout; the two paths add the same products in different orders.
RTOL, ATOL = 1e-4, 1e-5


def _varied(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Large random weights (norm weights too), so every path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            scale = 0.3 if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if p.dim() == 1 else 0.0))
    return model


def _llama_gqa(positions: int = 32) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=22,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
    )
    return _varied(LlamaForCausalLM(config), 3)


def _batch(Bp: int, P: int, G: int, C: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 22, (Bp, P), generator=g)
    prompt_mask = torch.ones(Bp, P, dtype=torch.bool)
    for b in range(Bp):
        prompt_mask[b, : b % P] = False  # left padding of several lengths
    completion_ids = torch.randint(3, 22, (Bp * G, C), generator=g)
    completion_mask = torch.ones(Bp * G, C, dtype=torch.bool)
    completion_mask[0, 2:] = False  # ended early
    completion_mask[-1, 1:] = False  # after one token (or, with C = 1, none padded)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _hidden_and_grads(model, native: bool, batch, seed: int = 5):
    model.zero_grad(set_to_none=True)
    hidden = Decoder(model, native=native).grouped_hidden(*batch)
    g = torch.Generator().manual_seed(seed)
    (hidden * torch.randn(hidden.shape, generator=g)).sum().backward()
    return hidden.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("which", ["qwen2_tiny", "llama_gqa"])
@pytest.mark.parametrize(("group_size", "C", "P"), [(1, 4, 5), (3, 4, 5), (2, 1, 5), (2, 3, 1)])
def test_native_training_forward_and_backward_match_autograd(varied_tiny, which, group_size, C, P):
    """(P = 1: no prompt row the last layer may skip.)"""
    model = varied_tiny[0] if which == "qwen2_tiny" else _llama_gqa()
    model.train()
    batch = _batch(Bp=3, P=P, G=group_size, C=C)
    assert Decoder(model)._native_training_applies()
    hidden, grads = _hidden_and_grads(model, True, batch)
    ref_hidden, ref_grads = _hidden_and_grads(model, False, batch)
    torch.testing.assert_close(hidden, ref_hidden, rtol=RTOL, atol=ATOL)
    assert grads.keys() == ref_grads.keys()
    # Every parameter of the hidden states gets a gradient (an untied lm_head is not one).
    untied = model.lm_head.weight is not model.model.embed_tokens.weight
    assert len(grads) == len(list(model.parameters())) - untied
    for name, grad in grads.items():
        ref = ref_grads[name]
        torch.testing.assert_close(
            grad,
            ref,
            rtol=RTOL,
            atol=ATOL * max(1.0, ref.abs().max()),
            msg=lambda m, name=name: f"{name}: {m}",
        )


@pytest.mark.parametrize("which", ["qwen2_tiny", "llama_gqa"])
def test_completions_sharing_a_beginning_share_its_rows(varied_tiny, which):
    """A group's completions that begin alike run their common prefix once (decoder_train.cpp's
    Layout): identical completions, completions that part after one or two tokens, the same
    tokens with a different mask (one ended early: not shared), and the same completion in
    another group (another prompt: not shared). Hidden states and every gradient against
    autograd, which runs every completion apart."""
    model = varied_tiny[0] if which == "qwen2_tiny" else _llama_gqa()
    model.train()
    prompt_ids, prompt_mask, _, _ = _batch(Bp=2, P=4, G=4, C=4)
    completion_ids = torch.tensor(
        [
            [5, 6, 7, 8],
            [5, 6, 7, 8],
            [5, 6, 9, 9],
            [5, 10, 7, 8],  # group 0
            [5, 6, 7, 8],
            [5, 6, 7, 8],
            [11, 6, 7, 8],
            [5, 6, 7, 3],  # group 1
        ]
    )
    completion_mask = torch.ones(8, 4, dtype=torch.bool)
    completion_mask[5, 2:] = False  # as row 4 but ended after two tokens
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    hidden, grads = _hidden_and_grads(model, True, batch)
    ref_hidden, ref_grads = _hidden_and_grads(model, False, batch)
    torch.testing.assert_close(hidden, ref_hidden, rtol=RTOL, atol=ATOL)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        ref = ref_grads[name]
        torch.testing.assert_close(
            grad,
            ref,
            rtol=RTOL,
            atol=ATOL * max(1.0, ref.abs().max()),
            msg=lambda m, name=name: f"{name}: {m}",
        )


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 8, 12])
def test_native_training_matches_autograd_at_every_head_size(head_dim):
    """The attention's loops are compiled per head size (16, 32, 64, 128: vectors of 8 held in
    registers) with a loop at any other size (8, 12 here): each path against autograd."""
    config = LlamaConfig(
        vocab_size=22,
        hidden_size=2 * head_dim,
        intermediate_size=40,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    model = _varied(LlamaForCausalLM(config), head_dim)
    model.train()
    batch = _batch(Bp=2, P=4, G=3, C=3)
    hidden, grads = _hidden_and_grads(model, True, batch)
    ref_hidden, ref_grads = _hidden_and_grads(model, False, batch)
    longest = max(config.hidden_size, config.intermediate_size)
    atol = chained_sum_atol(longest, layers=1, reference=ref_hidden)
    torch.testing.assert_close(hidden, ref_hidden, rtol=RTOL, atol=atol)
    for name, grad in grads.items():
        ref = ref_grads[name]  # (the backward runs the chain again, in reverse)
        atol = chained_sum_atol(longest, layers=2, reference=ref)
        torch.testing.assert_close(
            grad, ref, rtol=RTOL, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )


def _op_args(decoder: Decoder, batch) -> tuple:
    detached = [
        [t.detach() for t in a] if isinstance(a, list) else a.detach()
        for a in decoder._training_weights()
    ]
    return (*batch, *detached, *decoder._native_config())


def test_native_training_opcheck(varied_tiny):
    model, _ = varied_tiny
    decoder = Decoder(model)
    batch = _batch(Bp=2, P=4, G=2, C=3)
    args = list(_op_args(decoder, batch))
    for i in (4, 12):  # embed and final_norm ask for gradients; the lists stay constants
        args[i] = args[i].clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.nostall.decoder_train.default, tuple(args))
    out = torch.ops.nostall.decoder_train.default(
        *[a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    )
    grad = torch.randn_like(out[0])
    torch.library.opcheck(
        torch.ops.nostall.decoder_train_backward.default,
        (grad, *_op_args(decoder, batch)[:15], *out[1:], 4, 4, 1e-6),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_native_training_errors(varied_tiny):
    model, _ = varied_tiny
    decoder = Decoder(model)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(Bp=2, P=4, G=2, C=3)
    bad_token = completion_ids.clone()
    bad_token[1, 1] = 22
    right_padded = prompt_mask.clone()
    right_padded[1, -1] = False
    op = torch.ops.nostall.decoder_train.default
    weights = _op_args(decoder, (prompt_ids, prompt_mask, completion_ids, completion_mask))[4:]
    for change, message in [
        (dict(completion_ids=bad_token), "token 22 outside"),
        (dict(prompt_mask=right_padded), "prompt 1 must end in a real token"),
        (dict(completion_ids=completion_ids[:3]), r"completion_ids must be \[Bp \* G, C\]"),
        (dict(completion_mask=completion_mask[:, :2]), "completion_mask must be a CPU bool"),
        (dict(prompt_ids=prompt_ids.int()), "prompt_ids must be a CPU int64"),
        (dict(completion_ids=torch.randint(3, 22, (4, 70))), "exceeds the rotary tables"),
    ]:
        args = (
            dict(
                prompt_ids=prompt_ids,
                prompt_mask=prompt_mask,
                completion_ids=completion_ids,
                completion_mask=completion_mask,
            )
            | change
        )
        if "completion_ids" in change and change["completion_ids"].shape[1] == 70:
            args["completion_mask"] = torch.ones(4, 70, dtype=torch.bool)
        with pytest.raises(RuntimeError, match=message):
            op(*args.values(), *weights)
    # A weight of the wrong shape or dtype is named.
    wrong = list(weights)
    wrong[2] = [wrong[2][0][:-1], wrong[2][1]]
    with pytest.raises(RuntimeError, match=r"qkv_weight\[0\] must be"):
        op(prompt_ids, prompt_mask, completion_ids, completion_mask, *wrong)
    wrong = list(weights)
    wrong[0] = wrong[0].double()
    with pytest.raises(RuntimeError, match="embed must be float32"):
        op(prompt_ids, prompt_mask, completion_ids, completion_mask, *wrong)
    # The backward checks the activations it is given.
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    out = op(*batch, *weights)
    backward = torch.ops.nostall.decoder_train_backward.default
    with pytest.raises(RuntimeError, match="probs must be decoder_train's"):
        backward(
            out[0],
            *batch,
            *weights[:11],
            out[1],
            out[2],
            out[3][:, :-1],
            out[4],
            out[5],
            *weights[11:],
        )
    with pytest.raises(RuntimeError, match="grad_hidden must be a CPU float32"):
        backward(out[0][:-1], *batch, *weights[:11], *out[1:], *weights[11:])
    # The rotary tables are constants: asking for their gradient is an error, not a silent zero.
    args = list(weights)
    args[9] = args[9].clone().requires_grad_(True)
    args[0] = args[0].clone().requires_grad_(True)
    hidden = op(*batch, *args)[0]
    with pytest.raises(RuntimeError, match="cos and sin get no gradient"):
        hidden.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_into_a_flat_buffer_sets_and_adds_the_same_gradients(varied_tiny, dtype):
    """decoder_train_backward_into writes decoder_train_backward's outputs end to end into one
    buffer (the GRPO update's flat gradient), or adds them to what it holds."""
    model = varied_tiny[0].to(dtype)
    decoder = Decoder(model)
    batch = _batch(Bp=2, P=4, G=2, C=3)
    args = _op_args(decoder, batch)
    weights, config = args[4:15], args[15:]
    out = torch.ops.nostall.decoder_train.default(*args)
    grad = torch.randn(out[0].shape, generator=torch.Generator().manual_seed(2))
    fresh = torch.ops.nostall.decoder_train_backward.default(
        grad, *batch, *weights, *out[1:], *config
    )
    want = torch.cat([g.reshape(-1) for x in fresh for g in (x if isinstance(x, list) else [x])])
    into = torch.ops.nostall.decoder_train_backward_into.default
    flat = torch.full_like(want, float("nan"))  # (set: whatever it held is overwritten)
    into(grad, *batch, *weights, *out[1:], *config, flat, False)
    assert torch.equal(flat, want)
    before = torch.randn(want.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    flat.copy_(before)
    into(grad, *batch, *weights, *out[1:], *config, flat, True)
    # float32 adds as the tensors would (the GEMM's sum in another order); bf16 rounds the sum
    # once where the reference rounds the gradient first: apart by a rounding of each term
    # (2^-8 of its magnitude) and of the result.
    u = 1e-5 if dtype == torch.float32 else 2.0**-8
    ref = before.float() + want.float()
    bound = u * (before.float().abs() + want.float().abs() + ref.abs()) + 1e-30
    assert ((flat.float() - ref).abs() <= bound).all()
    torch.library.opcheck(
        into,
        (grad, *batch, *weights, *out[1:], *config, flat, True),
        test_utils=("test_schema", "test_faketensor"),
    )
    with pytest.raises(RuntimeError, match=r"flat_grad must be a contiguous CPU"):
        into(grad, *batch, *weights, *out[1:], *config, flat[:-1], False)


def test_long_completions_train_through_torchs_ops_and_short_ones_natively(varied_tiny):
    """The update's path by completion length (decoder.NATIVE_TRAINING_TOKENS): the native op up
    to it, torch's batched attention past it (faster there); either way the same hidden states
    and gradients as the other path, to the float32 tolerance above."""
    from nostall.lm import decoder as decoder_module

    model = _llama_gqa(positions=128)
    model.train()
    limit = decoder_module.NATIVE_TRAINING_TOKENS
    native = Decoder(model)
    assert native._native_training_applies(limit) and not native._native_training_applies(limit + 1)
    calls = []
    op = torch.ops.nostall.decoder_train.default

    def counted(*args):
        calls.append(args[2].shape[1])
        return op(*args)

    batch = _batch(Bp=2, P=3, G=2, C=limit + 1)
    original = torch.ops.nostall.decoder_train
    try:
        decoder_module.torch.ops.nostall.decoder_train = type(
            "Op", (), {"default": staticmethod(counted)}
        )()
        hidden, grads = _hidden_and_grads(model, True, batch)
        short = _batch(Bp=2, P=3, G=2, C=4)
        _hidden_and_grads(model, True, short)
    finally:
        decoder_module.torch.ops.nostall.decoder_train = original
    assert calls == [4]  # (the long batch never reached the native op)
    # Past the limit, the native op itself (called directly) agrees with the path taken.
    ref_hidden = op(*batch, *native._training_weights(), *native._native_config())[0]
    B, C = batch[2].shape
    torch.testing.assert_close(hidden, ref_hidden.view(B, C, -1).detach(), rtol=RTOL, atol=ATOL)
    assert grads
