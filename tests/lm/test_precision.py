"""bfloat16 compute over float32 master weights (`--dtype`, nostall/lm/precision.py), and the
behaviour/trainer log-prob mismatch measured every step and corrected (TRL's
vllm_importance_sampling_correction, token-truncated). (Before: a bf16 checkpoint was upcast
and everything ran in float32; the mismatch was neither reported nor corrected at staleness 0.)"""

import copy
import dataclasses

import pytest
import torch

import nostall
from nostall.algos import grpo
from nostall.algos.grpo.loss import grpo_loss
from nostall.algos.grpo.update import behaviour_mismatch, micro_batches
from nostall.lm import precision
from nostall.lm.hf_decoder import make_decoder
from nostall.lm.models import LanguageModel
from nostall.optim import ClippedAdam
from nostall.train import checkpoint
from tests.lm.architectures import build

LR = 1e-2
FAST = dict(num_prompts=2, num_generations=4, max_new_tokens=4, watch_syncs=False, learning_rate=LR)


def _setup(arch="llama", **settings):
    model, tokenizer = build(arch)
    args = grpo.GRPOCommandConfig(**{**FAST, **settings})
    return grpo.build(args, grpo.Inputs(lm=LanguageModel(model, tokenizer, arch))), args


def test_auto_is_bf16_only_where_the_hardware_has_it_and_not_for_the_toys(monkeypatch):
    cpu = torch.device("cpu")
    for has in (True, False):
        monkeypatch.setattr(precision, "bf16_hardware", lambda device, has=has: has)
        want = torch.bfloat16 if has else torch.float32
        assert precision.compute_dtype("auto", cpu, builtin=False) == want
        assert precision.compute_dtype("auto", cpu, builtin=True) == torch.float32
        assert precision.compute_dtype("bfloat16", cpu, builtin=True) == torch.bfloat16
        assert precision.compute_dtype("float32", cpu, builtin=False) == torch.float32
    with pytest.raises(ValueError, match="--dtype must be one of auto, float32, bfloat16"):
        grpo.GRPOCommandConfig(dtype="fp16").check()


@pytest.mark.parametrize("staleness", [0, 1])
def test_bf16_generates_and_trains_on_a_copy_of_float32_master_weights(staleness):
    setup, _ = _setup(dtype="bfloat16", staleness=staleness)
    master, compute = setup.lm.model, setup.compute
    assert {p.dtype for p in master.parameters()} == {torch.float32}
    assert setup.optimizer.flat_parameters.dtype == torch.float32
    assert {p.dtype for p in compute.parameters()} == {torch.bfloat16}
    assert setup.decoder.output_weight.dtype == torch.bfloat16
    rollout = setup.generator.model
    assert rollout is compute  # (on the CPU's thread backend, at any staleness: no copy)
    assert {p.dtype for p in rollout.parameters()} == {torch.bfloat16}
    published = setup.loop.weights.newest(copy=False)
    assert {v.dtype for v in published.values() if v.is_floating_point()} == {torch.bfloat16}
    for name, p in compute.named_parameters():
        assert torch.equal(p, dict(master.named_parameters())[name].to(torch.bfloat16))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_bf16_step_is_the_float32_step_on_the_bf16_gradients_summed_in_float32(accumulate):
    """The reference: a fresh bf16 copy's gradients of each micro-batch, widened and summed in
    float32, stepped by an independent ClippedAdam over a copy of the master weights."""
    setup, args = _setup(
        dtype="bfloat16", staleness=0, gradient_accumulation_steps=accumulate, entropy_coef=0.0
    )
    master = setup.lm.model
    batch = setup.loop.slots[0]
    setup.generator(batch)
    names = [name for name, _ in master.named_parameters()]
    reference = copy.deepcopy(master)
    ref_params = dict(reference.named_parameters())
    ref_optimizer = ClippedAdam(
        [ref_params[n] for n in _order(setup)],
        lr=args.learning_rate,
        max_grad_norm=args.max_grad_norm,
    )
    compute = precision.compute_copy(reference, torch.bfloat16)
    decoder = make_decoder(compute)
    sums = {n: torch.zeros_like(p) for n, p in ref_params.items()}
    advantage = nostall.group_advantages(
        batch.rewards, setup.group_index, args.num_prompts, args.scale_rewards
    )
    parts = micro_batches(batch, accumulate)
    rows = batch.completion_ids.shape[0] // accumulate
    for part, adv in zip(parts, advantage.split(rows), strict=True):
        compute.zero_grad(set_to_none=True)
        log_prob = grpo.policy_log_probs(decoder, part, 1.0, setup.vocab, args.num_generations)
        loss, *_ = grpo_loss(
            log_prob, log_prob.detach(), adv, part.completion_mask, args, part.log_probs
        )
        (loss / accumulate).backward()
        for name, p in compute.named_parameters():
            sums[name] += p.grad.float()
    for name, p in ref_params.items():
        p.grad.copy_(sums[name])
    ref_optimizer.apply_gradients()

    grpo.grpo_update(
        grpo.UpdateContext(setup.decoder, setup.stepper, args, setup.vocab, setup.group_index),
        batch,
        setup.corrects,
    )
    got = dict(master.named_parameters())
    for name in names:
        # (Adam's first step is lr * g / (|g| + eps): where |g| is near eps a last-bit
        # difference in g moves the step by up to a part in 10^4 of lr.)
        torch.testing.assert_close(got[name], ref_params[name], rtol=0, atol=1e-4 * LR)
        assert torch.equal(
            dict(setup.compute.named_parameters())[name], got[name].detach().to(torch.bfloat16)
        )


def _order(setup) -> list[str]:
    names = {id(p): n for n, p in setup.lm.model.named_parameters()}
    return [names[id(p)] for p in setup.optimizer.parameters_in_order]


def test_the_mismatch_is_measured_without_a_host_read_and_masked():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    behaviour = torch.tensor([[-1.1, -2.0, -1.0], [-0.4, -0.7, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    batch = type("B", (), {"log_probs": behaviour, "completion_mask": mask, "loss_mask": mask})()
    args = grpo.GRPOCommandConfig(is_cap=2.0)  # (token_truncate: min(ratio, 2))
    got = {
        k.split("/", 1)[1]: float(v) for k, v in behaviour_mismatch(trainer, batch, args).items()
    }
    delta = (trainer - behaviour)[mask]
    assert got["sampling_logp_difference/mean"] == pytest.approx(float(delta.abs().mean()))
    assert got["sampling_logp_difference/max"] == pytest.approx(0.2)
    ratio = delta.exp().clamp(max=2.0)
    assert got["importance_sampling_ratio/min"] == pytest.approx(float(ratio.min()))
    assert got["importance_sampling_ratio/mean"] == pytest.approx(float(ratio.mean()))
    assert got["importance_sampling_ratio/max"] == pytest.approx(float(ratio.max()))


def test_the_correction_is_trls_truncated_token_weight():
    """At staleness 0 the loss with behaviour log-probs is TRL's: each token's clipped
    surrogate times min(exp(trainer - behaviour), cap), aggregated as the loss type."""
    g = torch.Generator().manual_seed(0)
    log_prob = (-torch.rand(4, 5, generator=g) * 3).requires_grad_()
    behaviour = log_prob.detach() + torch.randn(4, 5, generator=g) * 0.5
    advantage = torch.randn(4, generator=g)
    mask = torch.rand(4, 5, generator=g) > 0.2
    args = grpo.GRPOCommandConfig(loss_type="dapo", is_cap=2.0)
    loss, *_ = grpo_loss(log_prob, log_prob.detach(), advantage, mask, args, behaviour)
    ratio = (log_prob - log_prob.detach()).exp()
    clipped = ratio.clamp(1 - args.clip_low, 1 + args.clip_low)
    surrogate = -torch.min(ratio * advantage[:, None], clipped * advantage[:, None])
    weight = (log_prob.detach() - behaviour).exp().clamp(max=2.0)
    want = (surrogate * weight * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, log_prob)
    (want_grad,) = torch.autograd.grad(want, log_prob)
    torch.testing.assert_close(grad, want_grad)


@pytest.mark.parametrize(
    ("dtype", "staleness", "flag", "corrects"),
    [
        ("float32", 0, True, False),
        ("bfloat16", 0, True, True),
        ("bfloat16", 0, False, False),
        ("float32", 1, False, True),
    ],
)
def test_which_runs_correct_for_the_behaviour_policy(dtype, staleness, flag, corrects):
    setup, _ = _setup(dtype=dtype, staleness=staleness, importance_sampling_correction=flag)
    assert setup.corrects is corrects


def test_a_bf16_update_reports_the_mismatch_and_reads_nothing():
    from nostall.profiler import SyncWatch

    setup, args = _setup(dtype="bfloat16", staleness=0)
    batch = setup.loop.slots[0]
    setup.generator(batch)
    grpo.grpo_update(
        grpo.UpdateContext(setup.decoder, setup.stepper, args, setup.vocab, setup.group_index),
        batch,
        setup.corrects,
    )  # (a warm-up update)
    setup.generator(batch)
    with SyncWatch(setup.lm.model, setup.compute) as watch:
        watch.mark(*batch.tensors().values(), *setup.device_tensors())
        metrics = grpo.grpo_update(
            grpo.UpdateContext(setup.decoder, setup.stepper, args, setup.vocab, setup.group_index),
            batch,
            setup.corrects,
        )
    assert watch.report().unintended_count == 0, watch.report().table()
    assert 0 < float(metrics["sampling/sampling_logp_difference/max"]) < 0.02
    assert float(metrics["sampling/importance_sampling_ratio/min"]) > 0.95


@pytest.mark.parametrize("resume_from", [1, 2])
def test_a_bf16_run_saves_float32_and_resumes_exactly(tmp_path, resume_from):
    """Checkpoints hold the master weights; a resume from the k-th rebuilds the compute copy
    from them and ends where the uninterrupted run ends."""

    def run(steps, resume=None, out="a"):
        model, tokenizer = build("llama")
        args = grpo.GRPOCommandConfig(
            **{
                **FAST,
                "dtype": "bfloat16",
                "staleness": 0,
                "steps": steps,
                "checkpoint": str(tmp_path / out / "c{step}.pt"),
                "checkpoint_every": 1,
                "resume": resume,
                "output_dir": str(tmp_path / out),
            }
        )
        trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
        trainer.train()
        return trainer

    whole = run(3)
    assert "compute bfloat16 (master weights float32)" in whole.report
    resumed = run(3, resume=str(tmp_path / "a" / f"c{resume_from}.pt"), out="b")
    for (name, a), b in zip(
        whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert a.dtype == torch.float32
        assert torch.equal(a, b), name
    _, state = checkpoint.load(tmp_path / "a" / "c3.pt", "grpo")
    assert {v.dtype for v in state["model"].values()} == {torch.float32}
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "model")
    assert reloaded.dtype == torch.float32


@pytest.mark.parametrize("backend", ["process", "ray"])
def test_bf16_weights_reach_the_other_backends(tmp_path, backend):
    if backend == "ray":
        pytest.importorskip("ray", reason="the ray backend needs Ray (the dev install has it)")
    model, tokenizer = build("llama")
    args = grpo.GRPOCommandConfig(
        **{
            **FAST,
            "dtype": "bfloat16",
            "staleness": 1,
            "steps": 3,
            "backend": backend,
            "checkpoint": str(tmp_path / "c.pt"),
            "checkpoint_every": 3,
        }
    )
    trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
    result = trainer.train()
    assert len(result.rewards) == 3
    _, state = checkpoint.load(tmp_path / "c.pt", "grpo")
    published = state["loop"]["published_weights"]
    compute = dict(trainer.setup.compute.named_parameters())
    for name, value in published.items():
        assert value.dtype == torch.bfloat16
        if name in compute:
            assert torch.equal(value, compute[name].detach()), name


def test_settings_compose():
    setup, args = _setup(dtype="bfloat16", staleness=0, beta=0.1)
    assert setup.reference.output_weight.dtype == torch.bfloat16
    batch = setup.loop.slots[0]
    setup.generator(batch)
    metrics = grpo.grpo_update(
        grpo.UpdateContext(
            setup.decoder,
            setup.stepper,
            dataclasses.replace(args, entropy_coef=0.1),
            setup.vocab,
            setup.group_index,
            reference=setup.reference,
        ),
        batch,
        setup.corrects,
    )
    assert all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_bf16_run_has_no_unintended_sync(staleness):
    model, tokenizer = build("llama")
    args = grpo.GRPOCommandConfig(
        **{**FAST, "dtype": "bfloat16", "staleness": staleness, "steps": 5, "watch_syncs": True}
    )
    result = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args).train()
    assert result.syncs_per_update == 0, result.sync_sites
    assert result.syncs_per_decode_step == 0, result.sync_sites


def test_a_bf16_master_run_holds_everything_in_bf16(tmp_path):
    """--master-dtype bfloat16 (TRL with the model loaded in bf16): weights, moments and the
    saved model in bf16, no second copy; it trains and resumes."""
    model, tokenizer = build("llama")
    args = grpo.GRPOCommandConfig(
        **{
            **FAST,
            "master_dtype": "bfloat16",
            "staleness": 0,
            "steps": 3,
            "output_dir": str(tmp_path / "run"),
            "checkpoint": str(tmp_path / "c{step}.pt"),
            "checkpoint_every": 2,
        }
    )
    trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
    setup = trainer.setup
    assert setup.compute is setup.lm.model and setup.precision is None
    assert {p.dtype for p in setup.lm.model.parameters()} == {torch.bfloat16}
    before = setup.optimizer.flat_parameters.clone()
    trainer.train()
    assert not torch.equal(before, setup.optimizer.flat_parameters)
    state = setup.optimizer.state_dict()["state"][0]
    assert state["exp_avg"].dtype == torch.bfloat16
    assert "compute bfloat16 (master weights bfloat16)" in trainer.report
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model", dtype="auto")
    assert saved.dtype == torch.bfloat16
    model, tokenizer = build("llama")
    resumed = grpo.GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=dataclasses.replace(args, resume=str(tmp_path / "c2.pt"), output_dir=None),
    )
    resumed.train()
    assert torch.equal(resumed.setup.optimizer.flat_parameters, setup.optimizer.flat_parameters)


def test_a_bf16_master_with_float32_compute_is_refused():
    with pytest.raises(ValueError, match="--master-dtype bfloat16 computes in bf16"):
        grpo.GRPOCommandConfig(master_dtype="bfloat16", dtype="float32").check()
    with pytest.raises(ValueError, match="--master-dtype must be float32 or bfloat16"):
        grpo.GRPOCommandConfig(master_dtype="float16").check()


@pytest.mark.parametrize("master", ["float32", "bfloat16"])
def test_a_bf16_checkpoint_trains_saves_and_reloads(tmp_path, master):
    """A model saved in bf16 (as most are published) trains from its directory: upcast into
    float32 master weights (saved in float32), or kept in bf16 with --master-dtype bfloat16."""
    from transformers import AutoModelForCausalLM

    from tests.lm.architectures import save

    folder = save("qwen3", tmp_path / "bf16", dtype=torch.bfloat16)
    args = grpo.GRPOCommandConfig(
        **{
            **FAST,
            "model": str(folder),
            "dtype": "bfloat16",
            "steps": 2,
            "master_dtype": master,
            "output_dir": str(tmp_path / "run"),
        }
    )
    trainer = grpo.GRPOTrainer(args=args)
    want = torch.float32 if master == "float32" else torch.bfloat16
    assert {p.dtype for p in trainer.model.parameters()} == {want}
    trainer.train()
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model", dtype="auto")
    assert saved.dtype == want
    before = AutoModelForCausalLM.from_pretrained(folder, dtype=want)
    moved = [n for n, p in saved.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert moved  # it trained


@pytest.mark.parametrize(("first", "then"), [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_a_run_resumes_in_the_other_compute_dtype(tmp_path, first, then):
    """The checkpoint holds float32 master weights whatever the compute dtype: a run resumes in
    the other one (its generation side's weights, published and its own, cast on the way)."""

    def run(dtype, steps, resume=None):
        model, tokenizer = build("llama")
        args = grpo.GRPOCommandConfig(
            **{
                **FAST,
                "dtype": dtype,
                "staleness": 1,
                "steps": steps,
                "checkpoint": str(tmp_path / f"{dtype}.pt"),
                "checkpoint_every": steps,
                "resume": resume,
            }
        )
        trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
        return trainer, trainer.train()

    run(first, 2)
    trainer, result = run(then, 4, resume=str(tmp_path / f"{first}.pt"))
    assert len(result.rewards) == 4 and all(r == r for r in result.rewards)
    computes = torch.float32 if then == "float32" else torch.bfloat16
    assert {p.dtype for p in trainer.setup.generator.model.parameters()} == {computes}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}


def test_lora_adapters_train_in_bf16_over_float32_masters():
    pytest.importorskip("peft", reason="LoRA needs peft (the dev install has it)")
    model, tokenizer = build("llama")
    args = grpo.GRPOCommandConfig(
        **{**FAST, "dtype": "bfloat16", "lora_r": 4, "steps": 3, "staleness": 0}
    )
    trainer = grpo.GRPOTrainer(model=model, processing_class=tokenizer, args=args)
    trained = {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    trainer.train()
    compute = dict(trainer.setup.compute.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(compute[name].detach(), p.detach().to(torch.bfloat16)), name
        if name in trained:
            assert not torch.equal(p, trained[name]), name  # every adapter moved
