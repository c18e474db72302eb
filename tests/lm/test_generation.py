"""The lean decoder and the generation engine against transformers: the forward's logits, the
grouped (shared-prompt) forward, greedy generation token for token against `model.generate`,
behaviour log-probs against the trainer's recomputed ones, no host sync per decode step."""

import pytest
import torch
import torch.nn.functional as F

from nostall.algos.grpo import policy_log_probs
from nostall.lm.batch import LMBatch
from nostall.lm.decoder import Decoder
from nostall.lm.generation import (
    Completions,
    GenerationEngine,
    SampledVocab,
    SamplingConfig,
    positions_of,
)
from nostall.profiler import SyncWatch
from tests.lm.tolerances import chained_sum_atol

PROMPTS = ["efffb=", "abc=", "h=", "0123="]


def _encode(lm, prompts, repeat=1):
    enc = lm.tokenizer(prompts, padding=True, return_tensors="pt", padding_side="left")
    ids = enc.input_ids.repeat_interleave(repeat, 0)
    return ids, enc.attention_mask.bool().repeat_interleave(repeat, 0)


def test_forward_matches_transformers(varied_tiny):
    model, lm = varied_tiny
    ids, mask = _encode(lm, PROMPTS)
    with torch.no_grad():
        ours = F.linear(Decoder(model).hidden(ids, mask, positions_of(mask)), model.lm_head.weight)
        theirs = model(
            input_ids=ids, attention_mask=mask.long(), position_ids=positions_of(mask)
        ).logits
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=1e-5, atol=1e-5)


def test_grouped_forward_matches_the_full_forward(varied_tiny):
    model, lm = varied_tiny
    G, C = 3, 4
    prompt_ids, prompt_mask = _encode(lm, PROMPTS)
    g = torch.Generator().manual_seed(0)
    completion_ids = torch.randint(3, 22, (len(PROMPTS) * G, C), generator=g)
    completion_mask = torch.ones(len(PROMPTS) * G, C, dtype=torch.bool)
    completion_mask[0, 2:] = False  # one completion ended early
    decoder = Decoder(model)
    grouped = decoder.grouped_hidden(prompt_ids, prompt_mask, completion_ids, completion_mask)
    ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], 1)
    keys = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
    full = decoder.hidden(ids, keys, positions_of(keys))[:, prompt_ids.shape[1] - 1 : -1]
    torch.testing.assert_close(
        grouped[completion_mask], full[completion_mask], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("group_size", [1, 3])
def test_greedy_generation_matches_generate_token_for_token(varied_tiny, group_size):
    model, lm = varied_tiny
    C = 10
    ids, mask = _encode(lm, PROMPTS, group_size)
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=C, top_k=1),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=[],
    )
    batch = Completions.empty(*ids.shape, C)
    batch.prompt_ids.copy_(ids)
    batch.prompt_mask.copy_(mask)
    engine.generate(batch, torch.Generator().manual_seed(0), group_size)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            max_new_tokens=C,
            do_sample=False,
            pad_token_id=lm.pad_token_id,
            eos_token_id=lm.eos_token_id,
        )[:, ids.shape[1] :]
    assert out.shape[1] >= 2 and len(set(out[:, 0].tolist())) > 1  # the outputs do vary
    expected = torch.full((len(ids), C), lm.pad_token_id)
    expected[:, : out.shape[1]] = out
    assert torch.equal(batch.completion_ids, expected)
    # The mask covers each completion up to and including its <eos>.
    ended = (expected == lm.eos_token_id).long().cumsum(1)
    assert torch.equal(batch.completion_mask, (ended - (expected == lm.eos_token_id).long()) == 0)


@pytest.mark.parametrize("ban", [True, False], ids=["specials banned", "nothing banned"])
def test_behaviour_log_probs_equal_the_trainers(varied_tiny, ban):
    model, lm = varied_tiny
    G, C = 4, 6
    ids, mask = _encode(lm, PROMPTS, G)
    banned = lm.banned_token_ids() if ban else []
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=C, temperature=0.8),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=banned,
    )
    batch = LMBatch.empty(len(ids), ids.shape[1], C)
    batch.prompt_ids.copy_(ids)
    batch.prompt_mask.copy_(mask)
    engine.generate(batch.completions(), torch.Generator().manual_seed(3), G)
    with torch.no_grad():
        vocab = SampledVocab.build(lm.vocab_size, banned)  # None when nothing is banned
        recomputed = policy_log_probs(Decoder(model), batch, 0.8, vocab, G)
    m = batch.completion_mask
    assert m.sum() > len(ids)  # several tokens per row
    # Stated tolerance: float32 rounding of a cached one-token decode against a full forward,
    # with logits of magnitude ~10 (these weights are large on purpose): 1e-4.
    torch.testing.assert_close(recomputed[m], batch.log_probs[m], rtol=1e-4, atol=1e-4)


def test_no_host_sync_per_decode_step(varied_tiny):
    model, lm = varied_tiny
    ids, mask = _encode(lm, PROMPTS, 2)
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=6),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=lm.banned_token_ids(),
    )
    batch = Completions.empty(*ids.shape, 6)
    batch.prompt_ids.copy_(ids)
    batch.prompt_mask.copy_(mask)
    generator = torch.Generator().manual_seed(0)
    engine.generate(batch, generator, 2)  # allocates the cache
    with SyncWatch(model) as watch:
        watch.mark(
            *batch.tensors().values(), engine._cache.keys, engine._cache.values, engine.allowed
        )
        engine.generate(batch, generator, 2)
    assert watch.report().unintended_count == 0, watch.report().table()


def test_early_stop_is_checked_every_k_tokens(varied_tiny):
    model, lm = varied_tiny
    ids, mask = _encode(lm, PROMPTS)
    engine = GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=12, stop_check_every=2),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=[],
    )
    batch = Completions.empty(*ids.shape, 12)
    batch.prompt_ids.copy_(ids)
    batch.prompt_mask.copy_(mask)
    with SyncWatch(model) as watch:
        watch.mark(*batch.tensors().values())
        engine.generate(batch, torch.Generator().manual_seed(0))
    # One read every 2 tokens at most: 5 checks for 12 tokens.
    assert watch.report().unintended_count <= 5


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=30))
    with pytest.raises(ValueError, match="'gpt2' is not a Llama-family decoder"):
        Decoder(model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_cuda_graph_decode_matches_eager(varied_tiny):
    model, lm = varied_tiny
    model = model.cuda()
    ids, mask = _encode(lm, PROMPTS, 2)
    out = {}
    for graph in (False, True):
        sampling = SamplingConfig(max_new_tokens=8, cuda_graph=graph)
        engine = GenerationEngine(
            Decoder(model),
            sampling,
            eos_token_id=lm.eos_token_id,
            pad_token_id=lm.pad_token_id,
            banned_token_ids=lm.banned_token_ids(),
        )
        batch = Completions.empty(*ids.shape, 8, device="cuda")
        batch.prompt_ids.copy_(ids)
        batch.prompt_mask.copy_(mask)
        for seed in (0, 1):  # the second batch replays the captured graph
            engine.generate(batch, torch.Generator("cuda").manual_seed(seed), 2)
            out[graph, seed] = batch.completion_ids.clone(), batch.log_probs.clone()
    for seed in (0, 1):
        assert torch.equal(out[False, seed][0], out[True, seed][0])
        torch.testing.assert_close(out[False, seed][1], out[True, seed][1])


def _llama_of_head_size(head_dim: int, vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=2 * head_dim,
        intermediate_size=40,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=32,
    )
    torch.manual_seed(head_dim)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("head_dim", [None, 32, 64, 128, 8, 12])
def test_native_decode_step_matches_the_python_one(varied_tiny, head_dim):
    """`nostall::decode_step` (the CPU generation path) against the decoder's tensor ops: the
    logits and the cache it writes, over several steps. Its attention is compiled per head size
    (16, the tiny model's; 32, 64, 128) with a loop at any other (8, 12)."""
    model, lm = varied_tiny
    if head_dim is not None:
        model = _llama_of_head_size(head_dim, model.config.vocab_size)
    ids, mask = _encode(lm, PROMPTS, 2)
    B, P = ids.shape
    native, python = Decoder(model, native=True), Decoder(model, native=False)
    native.freeze()
    python.freeze()
    caches = [d.new_cache(B, P + 4) for d in (native, python)]
    with torch.no_grad():
        for d, cache in zip((native, python), caches, strict=True):
            d.prefill(ids[::2], mask[::2], cache, 2)
        slot_mask = torch.zeros(B, P + 4, dtype=torch.bool)
        slot_mask[:, :P] = mask
        token = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
        position = mask.sum(1)
        slots = torch.arange(P + 4)
        for t in range(4):
            slot_mask[:, P + t] = True
            out = [
                d.decode(token, position + t, slots[P + t : P + t + 1], slot_mask, c)
                for d, c in zip((native, python), caches, strict=True)
            ]
            config = model.config
            longest = max(config.hidden_size, config.intermediate_size, P + t + 1)
            layers = config.num_hidden_layers
            atol = chained_sum_atol(longest, layers, out[1])
            torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=atol)
            token = out[1].argmax(-1)
    for mine, reference in ((caches[0].keys, caches[1].keys), (caches[0].values, caches[1].values)):
        atol = chained_sum_atol(longest, layers, reference)
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=atol)


def test_native_decode_step_opcheck_and_errors(varied_tiny):
    model, _ = varied_tiny
    decoder = Decoder(model)
    decoder.freeze()
    cache = decoder.new_cache(2, 6)
    args = dict(
        token=torch.tensor([3, 4]),
        position=torch.tensor([0, 1]),
        slot=torch.tensor([1]),
        slot_mask=torch.ones(2, 6, dtype=torch.bool),
    )
    with torch.no_grad():
        logits = decoder.decode(**args, cache=cache)
    assert logits.shape == (2, 22)
    layers = decoder.layers
    op_args = (
        args["token"],
        args["position"],
        args["slot"],
        args["slot_mask"],
        decoder.embed.weight.detach(),
        [x.input_layernorm.weight.detach() for x in layers],
        [w.detach() for w, _, _ in decoder._fused],
        [b.detach() for _, b, _ in decoder._fused],
        [x.self_attn.o_proj.weight.detach() for x in layers],
        [x.post_attention_layernorm.weight.detach() for x in layers],
        [g.detach() for _, _, g in decoder._fused],
        [x.mlp.down_proj.weight.detach() for x in layers],
        decoder.norm.weight.detach(),
        decoder.output_weight.detach(),
        decoder.cos,
        decoder.sin,
        cache.keys,
        cache.values,
        4,
        4,
        1e-6,
    )
    for slot in (args["slot"], torch.tensor([2, 5])):  # (every row's slot; a slot a row)
        torch.library.opcheck(
            torch.ops.nostall.decode_step.default,
            (*op_args[:2], slot, *op_args[3:]),
            test_utils=("test_schema", "test_faketensor"),
        )
    for change, message in [
        (dict(token=torch.tensor([3, 99])), "token 99 outside"),
        (dict(position=torch.tensor([0, 64])), "position 64 outside"),
        (dict(slot=torch.tensor([6])), "slot 6 outside"),
        (dict(slot=torch.tensor([1, 6])), "slot 6 outside"),
        (dict(slot=torch.tensor([1, 2, 3])), "slot must be"),
        (dict(slot_mask=torch.ones(2, 5, dtype=torch.bool)), "slot_mask must be"),
    ]:
        with torch.no_grad(), pytest.raises(RuntimeError, match=message):
            decoder.decode(**{**args, **change}, cache=cache)


@pytest.mark.parametrize("group_size", [1, 3])
def test_native_prefill_matches_the_python_one(varied_tiny, group_size):
    """`nostall::prefill_prompts` against the decoder's tensor-op prefill: the logits of every
    row and the keys and values it writes (left padding of several lengths, groups sharing a
    prompt), then a decode step from each cache."""
    model, lm = varied_tiny
    ids, mask = _encode(lm, PROMPTS)
    Bp, P = ids.shape
    B = Bp * group_size
    native, python = Decoder(model, native=True), Decoder(model, native=False)
    native.freeze()
    python.freeze()
    caches = [d.new_cache(B, P + 2) for d in (native, python)]
    with torch.no_grad():
        out = [
            d.prefill(ids, mask, c, group_size)
            for d, c in zip((native, python), caches, strict=True)
        ]
        torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)
        # Only the slots real tokens wrote are read later; padding slots must be finite too.
        for name in ("keys", "values"):
            a, b = getattr(caches[0], name), getattr(caches[1], name)
            torch.testing.assert_close(a[..., :P, :], b[..., :P, :], rtol=1e-5, atol=1e-5)
            assert torch.isfinite(a).all()
        slot_mask = torch.zeros(B, P + 2, dtype=torch.bool)
        slot_mask[:, :P] = mask.repeat_interleave(group_size, 0)
        slot_mask[:, P] = True
        token = out[1].argmax(-1)
        position = slot_mask[:, :P].sum(1)
        step = [
            d.decode(token, position, torch.tensor([P]), slot_mask, c)
            for d, c in zip((native, python), caches, strict=True)
        ]
    torch.testing.assert_close(step[0], step[1], rtol=1e-5, atol=1e-5)


def test_native_prefill_opcheck_and_errors(varied_tiny):
    model, lm = varied_tiny
    decoder = Decoder(model)
    decoder.freeze()
    ids, mask = _encode(lm, PROMPTS[:2])
    cache = decoder.new_cache(4, ids.shape[1] + 3)
    op_args = (
        ids,
        mask,
        2,
        *decoder._weight_lists(),
        cache.keys,
        cache.values,
        *decoder._native_config(),
    )
    op_args = tuple(
        [t.detach() for t in a]
        if isinstance(a, list)
        else a.detach()
        if isinstance(a, torch.Tensor)
        else a
        for a in op_args
    )
    torch.library.opcheck(
        torch.ops.nostall.prefill_prompts.default,
        op_args,
        test_utils=("test_schema", "test_faketensor"),
    )
    bad_ids = ids.clone()
    bad_ids[0, -1] = 99
    right_padded = mask.clone()
    right_padded[0, -1] = False
    for change, message in [
        (dict(prompt_ids=bad_ids), "token 99 outside"),
        (dict(prompt_mask=right_padded), "prompt 0 must end in a real token"),
        (dict(prompt_mask=mask[:, 1:]), "prompt_mask must be a CPU bool"),
        (dict(group_size=3), r"Bp \* group_size = 6, got 4 rows"),
        (dict(group_size=0), "group_size must be at least 1"),
        (dict(cache=decoder.new_cache(4, ids.shape[1] - 1)), "the cache has"),
    ]:
        args = dict(prompt_ids=ids, prompt_mask=mask, cache=cache, group_size=2) | change
        with torch.no_grad(), pytest.raises(RuntimeError, match=message):
            decoder.prefill(**args)


def test_sampled_vocab_maps_allowed_tokens_and_refuses_an_empty_one():
    vocab = SampledVocab.build(6, [0, 4])
    assert vocab.ids.tolist() == [1, 2, 3, 5]
    assert vocab.index[vocab.ids].tolist() == [0, 1, 2, 3]
    assert SampledVocab.build(6, []) is None
    with pytest.raises(ValueError, match="every token"):
        SampledVocab.build(2, [0, 1])
