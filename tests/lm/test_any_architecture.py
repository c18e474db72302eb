"""Any `transformers` causal LM trains: the architectures the lean forward does not reproduce
run through their own forward (nostall/lm/hf_decoder.py); for each, the trainer's log-probs
match the model's own logits, generation's behaviour log-probs match the trainer's, and
`nostall train grpo --model DIR` trains, saves and reloads. (Before: every architecture but
Llama, Qwen2 and Mistral without a window was refused.)"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nostall.algos import grpo
from nostall.lm.decoder import Decoder
from nostall.lm.hf_decoder import HFDecoder, make_decoder
from nostall.lm.models import LanguageModel
from tests.lm.architectures import ARCHITECTURES, build, save
from tests.lm.log_probs import generated_and_trainer

ROOT = Path(__file__).resolve().parent.parent.parent
# float32: the two computations differ in operation order only. bfloat16 (--dtype
# bfloat16): each rounds its products and activations to 8 significant bits in its own order
# (the cache's one token at a time against the trainer's whole sequence).
ATOL = 2e-5
BF16_ATOL = 0.02


def _batch(G=3, P=5, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 22, (2, P), generator=g)
    prompt_mask = torch.ones(2, P, dtype=torch.bool)
    prompt_mask[0, :2] = False  # left-padded
    prompt_ids[0, :2] = 0
    completion_ids = torch.randint(3, 22, (2 * G, C), generator=g)
    completion_mask = torch.ones(2 * G, C, dtype=torch.bool)
    completion_mask[1, 2:] = False
    return prompt_ids, prompt_mask, completion_ids, completion_mask


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_trainers_log_probs_are_the_models_own(arch):
    model, _ = build(arch)
    decoder = HFDecoder(model)  # (the generic path, also for the lean forward's architectures)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    G = completion_ids.shape[0] // prompt_ids.shape[0]
    hidden = decoder.grouped_hidden(prompt_ids, prompt_mask, completion_ids, completion_mask)
    # (the loss's own function: the chunked op, or the soft-capped chunks for Gemma2)
    mine = grpo.head_log_probs(decoder, hidden, decoder.output_weight, completion_ids, 1.0)
    ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    P = prompt_ids.shape[1]
    theirs = torch.log_softmax(logits[:, P - 1 : -1], -1).gather(-1, completion_ids[..., None])
    torch.testing.assert_close(
        mine[completion_mask], theirs[..., 0][completion_mask], rtol=0, atol=ATOL
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_generation_and_trainer_log_probs_agree(arch, dtype):
    """GRPO's generation side (the model's own cache, sample_tokens) records behaviour
    log-probs the trainer reproduces from the same weights, in either compute dtype."""
    model, tokenizer = build(arch)
    lm = LanguageModel(model, tokenizer, arch)
    args = grpo.GRPOCommandConfig(
        num_prompts=2, num_generations=3, max_new_tokens=6, top_k=5, watch_syncs=False, dtype=dtype
    )
    setup = grpo.build(args, grpo.Inputs(lm=lm))
    expected = Decoder if arch in ("llama", "qwen2") else HFDecoder
    assert isinstance(setup.decoder, expected)
    behaviour, trainer = generated_and_trainer(setup, args)
    assert setup.loop.slots[0].completion_mask[:, 0].all() and (behaviour < 0).all()
    computes = torch.float32 if dtype == "float32" else torch.bfloat16
    assert setup.decoder.output_weight.dtype == computes
    assert all(p.dtype == torch.float32 for p in setup.lm.model.parameters())  # the master
    atol = ATOL if dtype == "float32" else BF16_ATOL
    torch.testing.assert_close(trainer, behaviour, rtol=0, atol=atol)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_lean_forward_matches_the_generic_path(arch):
    """Where the lean forward (and its native ops) applies, it is the model's own forward."""
    model, _ = build(arch)
    batch = _batch()
    with torch.no_grad():
        lean = Decoder(model).grouped_hidden(*batch)
        generic = HFDecoder(model).grouped_hidden(*batch)
    mask = batch[3]
    torch.testing.assert_close(lean[mask], generic[mask], rtol=1e-4, atol=ATOL)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "gpt2", "phi3", "olmo2", "mistral_sliding"])
def test_the_command_trains_saves_and_reloads_any_architecture(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save(arch, tmp_path / arch)
    out = tmp_path / "run"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nostall",
            "train",
            "grpo",
            "--model",
            str(folder),
            "--steps",
            "3",
            "--num-prompts",
            "2",
            "--num-generations",
            "2",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    reloaded = AutoModelForCausalLM.from_pretrained(out / "model")
    before = AutoModelForCausalLM.from_pretrained(folder)
    assert type(reloaded) is type(before)
    moved = [
        n for n, p in reloaded.state_dict().items() if not torch.equal(p, before.state_dict()[n])
    ]
    assert moved  # it trained


def test_a_model_whose_logits_are_transformed_otherwise_is_named():
    """Soft-capped logits (Gemma2) train; a transformation the log-probs do not apply
    (Cohere's logit_scale) is named rather than trained on wrong probabilities."""
    from transformers import CohereConfig, CohereForCausalLM

    model = CohereForCausalLM(
        CohereConfig(
            vocab_size=22,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            logit_scale=0.5,
        )
    )
    with pytest.raises(ValueError, match=r"logit_scale = 0\.5"):
        make_decoder(model)


@pytest.mark.parametrize("stop_check_every", [32, 0])
def test_long_completions_run_end_to_end(tmp_path, stop_check_every):
    """1,024-token completions on a model whose context holds them: generation stops once
    every completion ended (checked every 32 tokens), or runs all 1,024 (0: no check)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from nostall.lm.models import char_tokenizer
    from tests.lm.architectures import COMMON

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1040,
        **COMMON,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "long")
    char_tokenizer().save_pretrained(tmp_path / "long")
    args = grpo.GRPOCommandConfig(
        model=str(tmp_path / "long"),
        steps=2,
        num_prompts=2,
        num_generations=2,
        max_new_tokens=1024,
        watch_syncs=False,
        stop_check_every=stop_check_every,
        learning_rate=1e-3,
    )
    result = grpo.GRPOTrainer(args=args).train()
    assert len(result.rewards) == 2 and result.tokens > 0
