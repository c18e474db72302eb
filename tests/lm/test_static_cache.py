"""The generic path generates over transformers' StaticCache where the model supports one (every
architecture tested): each slot allocated once and written in place, no copy of the whole cache
a token as a DynamicCache makes. Against the DynamicCache on the same batch and noise, per
architecture (sliding windows and soft-capping included), the tokens are the same and the
behaviour log-probs within float32 rounding; a model without the support is named when a static
cache is asked for."""

import pytest
import torch

from nostall.lm.generation import Completions, GenerationEngine, SamplingConfig
from nostall.lm.hf_decoder import HFCache, HFDecoder
from tests.lm.architectures import ARCHITECTURES, build

ATOL = 2e-5  # float32: the same products over a longer, masked key range


def _generate(decoder: HFDecoder, seed: int = 0) -> Completions:
    # Completions past the sliding window (4) of the windowed architectures, left padding.
    B, G, P, C = 2, 3, 5, 9
    engine = GenerationEngine(
        decoder,
        SamplingConfig(max_new_tokens=C, stop_check_every=0),
        eos_token_id=2,
        pad_token_id=0,
        banned_token_ids=[0, 1],
    )
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 22, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.bool)
    prompts[0, :2], mask[0, :2] = 0, False
    batch = Completions.empty(B * G, P, C)
    batch.prompt_ids.copy_(prompts.repeat_interleave(G, 0))
    batch.prompt_mask.copy_(mask.repeat_interleave(G, 0))
    return engine.generate(batch, torch.Generator().manual_seed(seed + 1), group_size=G)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_static_cache_generates_what_the_dynamic_one_does(arch):
    model, _ = build(arch)
    static, dynamic = HFDecoder(model), HFDecoder(model, static_cache=False)
    assert static.static_cache
    assert isinstance(static.new_cache(6, 14), HFCache) and static.new_cache(6, 14).slots == 14
    for seed in (0, 1):
        a, b = _generate(static, seed), _generate(dynamic, seed)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.completion_mask, b.completion_mask)
        torch.testing.assert_close(a.log_probs, b.log_probs, rtol=0, atol=ATOL)


def test_a_static_cache_the_model_does_not_support_is_named():
    model, _ = build("llama")
    model._can_compile_fullgraph = False  # (the instance only)
    assert not HFDecoder(model).static_cache
    with pytest.raises(ValueError, match="does not support a static cache"):
        HFDecoder(model, static_cache=True)
