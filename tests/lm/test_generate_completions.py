"""`nostall::generate_completions` (a whole batch in one native op) against the engine's Python
loop over the same kernels and the same noise: bit for bit, over groups, temperatures, top-k/p
and banned tokens, including a batch that ends before max_new_tokens (the op stops early, the
loop does not); the generator left in the same state; opcheck; every bad argument named."""

import copy

import pytest
import torch

from nostall.lm.decoder import Decoder
from nostall.lm.generation import Completions, GenerationEngine, SamplingConfig

PROMPTS = ["efffb=", "abc=", "h=", "0123="]


def _engine(model, lm, C, banned, **sampling):
    return GenerationEngine(
        Decoder(model),
        SamplingConfig(max_new_tokens=C, **sampling),
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.pad_token_id,
        banned_token_ids=banned,
    )


def _generate(engine, lm, G, C, seed, python_loop: bool):
    enc = lm.tokenizer(PROMPTS, padding=True, return_tensors="pt", padding_side="left")
    batch = Completions.empty(len(PROMPTS) * G, enc.input_ids.shape[1], C)
    batch.prompt_ids.copy_(enc.input_ids.repeat_interleave(G, 0))
    batch.prompt_mask.copy_(enc.attention_mask.bool().repeat_interleave(G, 0))
    generator = torch.Generator().manual_seed(seed)
    # A between-tokens hook that changes nothing keeps the engine on its Python loop.
    engine.generate(batch, generator, G, (lambda t: False) if python_loop else None)
    return batch, generator.get_state()


@pytest.mark.parametrize(
    ("G", "C", "sampling", "ban"),
    [
        (1, 6, dict(temperature=1.0), True),
        (3, 5, dict(temperature=0.7, top_k=5), True),
        (2, 8, dict(temperature=1.3, top_p=0.9), False),
    ],
)
def test_the_native_batch_equals_the_python_loop(varied_tiny, G, C, sampling, ban):
    model, lm = varied_tiny
    banned = lm.banned_token_ids() if ban else []
    native, native_state = _generate(_engine(model, lm, C, banned, **sampling), lm, G, C, 0, False)
    loop, loop_state = _generate(_engine(model, lm, C, banned, **sampling), lm, G, C, 0, True)
    assert torch.equal(native.completion_ids, loop.completion_ids)
    assert torch.equal(native.completion_mask, loop.completion_mask)
    assert torch.equal(native.log_probs, loop.log_probs)
    assert torch.equal(native_state, loop_state)
    assert native.completion_mask.sum() > len(native.completion_ids)  # several tokens a row


def test_a_batch_that_ends_early_matches_and_leaves_the_generator_alike(varied_tiny):
    """Every token but <eos> banned: each row ends at its first token, the op stops there."""
    model, lm = varied_tiny
    banned = [t for t in range(lm.vocab_size) if t != lm.eos_token_id]
    C = 4
    native, native_state = _generate(_engine(model, lm, C, banned), lm, 2, C, 1, False)
    loop, loop_state = _generate(_engine(model, lm, C, banned), lm, 2, C, 1, True)
    assert (native.completion_ids[:, 0] == lm.eos_token_id).all()
    assert (native.completion_ids[:, 1:] == lm.pad_token_id).all()
    assert torch.equal(native.completion_mask, loop.completion_mask)
    assert native.completion_mask.sum() == len(native.completion_ids)
    assert torch.equal(native.log_probs, loop.log_probs)
    assert torch.equal(native_state, loop_state)


def _op_args(model, lm, C=3, G=2):
    decoder = Decoder(model)
    decoder.freeze()
    enc = lm.tokenizer(PROMPTS[:2], padding=True, return_tensors="pt", padding_side="left")
    ids, mask = enc.input_ids, enc.attention_mask.bool()
    B, P = len(ids) * G, ids.shape[1]
    cache = decoder.new_cache(B, P + C)
    uniform = torch.rand(C, B, lm.vocab_size, generator=torch.Generator().manual_seed(0))
    allowed = torch.ones(lm.vocab_size, dtype=torch.bool)
    return dict(prompt_ids=ids, prompt_mask=mask, group_size=G, uniform=uniform, allowed=allowed), (
        *decoder._weight_lists(),
        cache.keys,
        cache.values,
        *decoder._native_config(),
        1.0,
        0,
        1.0,
        lm.eos_token_id,
        lm.pad_token_id,
    )


def _call(head: dict, tail: tuple):
    with torch.no_grad():
        return torch.ops.nostall.generate_completions.default(*head.values(), *tail)


def test_generate_completions_opcheck(varied_tiny):
    model, lm = varied_tiny
    head, tail = _op_args(model, lm)
    ids, mask, log_prob = _call(head, tail)
    assert ids.shape == mask.shape == log_prob.shape == (4, 3)
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool
    torch.library.opcheck(
        torch.ops.nostall.generate_completions.default,
        (*head.values(), *tail),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_generate_completions_errors(varied_tiny):
    model, lm = varied_tiny
    head, tail = _op_args(model, lm)
    C, B, V = head["uniform"].shape
    for change, message in [
        (dict(group_size=0), "group_size must be at least 1"),
        # two prompts of 2**62 completions each: the row count would wrap int64
        (dict(group_size=2**62), r"Bp \* group_size = 2 \* 4611686018427387904 overflows int64"),
        (dict(uniform=torch.rand(C, B + 1, V)), "uniform must be a CPU float32"),
        (dict(uniform=torch.rand(C, B, V, dtype=torch.float64)), "uniform must be a CPU float32"),
        (dict(uniform=torch.rand(C, B, V + 1)), "uniform must have the shape of logits"),
        (dict(uniform=torch.rand(C + 2, B, V)), "slots cannot hold"),
        (dict(prompt_mask=head["prompt_mask"][:, 1:]), "prompt_mask must be a CPU bool"),
        (dict(allowed=torch.ones(V + 1, dtype=torch.bool)), "allowed must be"),
    ]:
        with pytest.raises(RuntimeError, match=message):
            _call({**head, **change}, tail)


def test_the_tokenizer_backend_decodes_and_encodes_as_the_wrapper(varied_tiny):
    """The generation side calls the `tokenizers` object directly where it gives what the
    transformers wrapper gives, and keeps the wrapper where it would not (clean-up of spaces)."""
    from nostall.lm.prompts import PromptEncoder

    _, lm = varied_tiny
    prompts = ["efffb=", "abc=", "h=", "0123="]
    encoder = PromptEncoder(lm.tokenizer, prompts, lm.max_positions, 5)
    assert encoder.backend is not None
    rows = [[3, 4, 2, 0], [1, 5, 6, 7], [2, 2, 0, 0]]
    assert [encoder.backend.decode(r, skip_special_tokens=True) for r in rows] == (
        lm.tokenizer.batch_decode(rows, skip_special_tokens=True)
    )
    assert [encoder.backend.encode(p).ids for p in prompts] == lm.tokenizer(prompts).input_ids
    cleaning = copy.deepcopy(lm.tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    assert PromptEncoder(cleaning, prompts, lm.max_positions, 5).backend is None
