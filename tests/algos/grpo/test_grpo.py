"""GRPO (nostall/algos/grpo.py): each loss type against TRL's formula written out, the
decoupled objective against its formula, staleness 0 against a plain generate-then-train loop
(bit for bit), exact resume from the k-th checkpoint, learning the copy task, no host sync in
an update, and bad input named."""

import copy
import dataclasses
import statistics

import pytest
import torch

import nostall
from nostall.algos import grpo
from nostall.train import checkpoint
from nostall.train.checkpoint import CheckpointError


def _batch(seed=0, B=12, C=5):
    g = torch.Generator().manual_seed(seed)
    log_prob = (torch.randn(B, C, generator=g) * 0.3 - 1.0).requires_grad_()
    old = log_prob.detach() + torch.randn(B, C, generator=g) * 0.2
    behaviour = old + torch.randn(B, C, generator=g) * 0.3
    ref = log_prob.detach() + torch.randn(B, C, generator=g) * 0.1
    advantage = torch.randn(B, generator=g)
    mask = torch.rand(B, C, generator=g) < 0.8
    mask[:, 0] = True
    return log_prob, old, behaviour, ref, advantage, mask


def trl_loss(
    log_prob, old, advantage, mask, loss_type, eps_low, eps_high, beta, ref, max_len, bias=True
):
    """TRL GRPOTrainer._compute_loss (1.16), written out; `bias`: use_bias_correction_kl (the
    KL times coef_1, through which its gradient flows too)."""
    coef_1 = torch.exp(log_prob - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(coef_1 * advantage[:, None], coef_2 * advantage[:, None])
    if beta:
        kl = torch.exp(ref - log_prob) - (ref - log_prob) - 1
        per_token = per_token + beta * (kl * coef_1 if bias else kl)
    m = mask.float()
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo" or loss_type == "dapo":  # one process: num_items_in_batch = mask sum
        return (per_token * m).sum() / m.sum().clamp(min=1.0)
    return (per_token * m).sum() / (per_token.size(0) * max_len)  # dr_grpo


@pytest.mark.parametrize("loss_type", list(grpo.AGGREGATIONS))
@pytest.mark.parametrize(("beta", "bias"), [(0.0, True), (0.04, True), (0.04, False)])
@pytest.mark.parametrize("clip_high", [None, 0.28])
def test_each_loss_type_matches_trls_formula(loss_type, beta, bias, clip_high):
    log_prob, old, _, ref, advantage, mask = _batch()
    args = grpo.GRPOCommandConfig(
        loss_type=loss_type, beta=beta, clip_high=clip_high, use_bias_correction_kl=bias
    )
    loss = grpo.grpo_loss(log_prob, old, advantage, mask, args, ref_log_prob=ref if beta else None)[
        0
    ]
    ours = torch.autograd.grad(loss, log_prob)[0]
    expected = trl_loss(
        log_prob,
        old,
        advantage,
        mask,
        loss_type,
        0.2,
        clip_high if clip_high is not None else 0.2,
        beta,
        ref,
        5,
        bias,
    )
    theirs = torch.autograd.grad(expected, log_prob)[0]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_decoupled_loss_matches_its_formula():
    """AReaL's decoupled PPO objective: the clip against the proximal policy, each token weighted
    by min(pi_prox / pi_behaviour, cap) (a constant)."""
    log_prob, proximal, behaviour, _, advantage, mask = _batch(seed=3)
    args = grpo.GRPOCommandConfig(loss_type="grpo", is_cap=1.5)
    loss = grpo.grpo_loss(log_prob, proximal, advantage, mask, args, behavior_log_prob=behaviour)[0]
    ratio = torch.exp(log_prob - proximal)
    clipped = torch.clamp(ratio, 0.8, 1.2)
    weight = torch.clamp(torch.exp(proximal - behaviour), max=1.5)
    per_token = -torch.min(ratio * advantage[:, None], clipped * advantage[:, None]) * weight
    m = mask.float()
    expected = ((per_token * m).sum(-1) / m.sum(-1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    grad = torch.autograd.grad(loss, log_prob)[0]
    torch.testing.assert_close(
        grad, torch.autograd.grad(expected, log_prob)[0], rtol=1e-5, atol=1e-6
    )


# Staleness 0 unless a test says otherwise: bit-for-bit comparisons need the synchronous run.
FAST = dict(
    steps=6, num_prompts=4, num_generations=4, watch_syncs=False, log_interval=2, staleness=0
)


def _parameters(setup) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in setup.lm.model.state_dict().items()}


def test_staleness_zero_is_a_plain_generate_then_train_loop():
    args = grpo.GRPOCommandConfig(**FAST)
    run = grpo.build(args)
    result = grpo.train(args, setup=run)

    plain = grpo.build(args)  # the same seeds; no runtime: generate, then train, in turn
    batch = plain.loop.slots[0]
    rewards = []
    for _ in range(args.steps):
        plain.generator(batch)  # with the rollout copy, synced after every update below
        grpo.grpo_update(
            grpo.UpdateContext(
                plain.decoder, plain.optimizer, args, plain.vocab, plain.group_index
            ),
            batch,
            False,
        )
        plain.loop.rollout_model.load_state_dict(plain.lm.model.state_dict())
        rewards.append(batch.reward_mean)
    assert result.rewards == rewards
    mine, theirs = _parameters(run), _parameters(plain)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("k", [2, 4])
def test_resume_from_the_kth_checkpoint_is_exact(tmp_path, k):
    args = grpo.GRPOCommandConfig(
        **FAST, checkpoint=str(tmp_path / "ckpt-{step}.pt"), checkpoint_every=2
    )
    full = grpo.build(args)
    result = grpo.train(args, setup=full)
    resumed_args = dataclasses.replace(
        args, resume=str(tmp_path / f"ckpt-{k}.pt"), checkpoint=str(tmp_path / "again-{step}.pt")
    )
    resumed = grpo.build(resumed_args)
    again = grpo.train(resumed_args, setup=resumed)
    assert again.rewards == result.rewards
    mine, theirs = _parameters(full), _parameters(resumed)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    # And the optimizer state, which a resume from a later checkpoint depends on.
    a, b = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)


def test_resume_with_staleness_restores_the_queued_batches(tmp_path):
    args = grpo.GRPOCommandConfig(
        **dict(FAST, staleness=1), checkpoint=str(tmp_path / "c-{step}.pt"), checkpoint_every=3
    )
    first = grpo.train(args)
    resumed = grpo.train(
        dataclasses.replace(args, resume=str(tmp_path / "c-3.pt"), checkpoint=None)
    )
    # The batch trained on right after the checkpoint was already generated then: it is the
    # same batch, restored from the checkpoint.
    assert resumed.rewards[:4] == first.rewards[:4]
    assert len(resumed.rewards) == args.steps


def test_resume_refuses_conflicting_arguments(tmp_path):
    args = grpo.GRPOCommandConfig(**FAST, checkpoint=str(tmp_path / "c.pt"), checkpoint_every=6)
    grpo.train(args)
    bad = dataclasses.replace(
        args, resume=str(tmp_path / "c.pt"), learning_rate=1e-4, num_generations=8
    )
    with pytest.raises(CheckpointError, match=r"learning_rate .*num_generations"):
        grpo.train(bad)


@pytest.mark.parametrize("k", [2, 4])
def test_a_checkpoint_from_before_the_entropy_bonus_resumes_without_one(tmp_path, k):
    """Checkpoints written before `entropy_coef` existed trained with no bonus: they resume
    exactly with --entropy-coef 0 (from the k-th save), and the default bonus is refused by
    name rather than silently mixed into a run that had none."""
    args = grpo.GRPOCommandConfig(
        **FAST, entropy_coef=0.0, checkpoint=str(tmp_path / "c-{step}.pt"), checkpoint_every=2
    )
    first = grpo.train(args)
    path = tmp_path / f"c-{k}.pt"
    saved, state = checkpoint.load(path, "grpo")
    del saved["entropy_coef"]
    checkpoint.save(path, "grpo", saved, state)
    resumed = dataclasses.replace(args, resume=str(path), checkpoint=None)
    assert grpo.train(resumed).rewards == first.rewards
    with pytest.raises(CheckpointError, match=r"entropy_coef \(saved 0.0, now 0.05\)"):
        grpo.train(dataclasses.replace(resumed, entropy_coef=0.05))


def _entropy_and_surrogate(setup, args, batch, loss_type):
    """The mean token entropy of the sampling distribution over the completion tokens and the
    surrogate at the current weights, from the full logits (no chunking, no native head)."""
    with torch.no_grad():
        hidden, weight, tokens = grpo.policy_head(
            setup.decoder, batch, args.temperature, setup.vocab, args.num_generations
        )
        logits = hidden @ weight.T
        entropy = torch.distributions.Categorical(logits=logits).entropy()
        mask = batch.completion_mask
        want_entropy = (entropy * mask).sum() / mask.sum()
        log_prob = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
        advantage = nostall.group_advantages(
            batch.rewards, setup.group_index, args.num_prompts, args.scale_rewards
        )
        surrogate = nostall.clipped_policy_loss(
            log_prob,
            log_prob,
            advantage,
            mask,
            aggregation=grpo.AGGREGATIONS[loss_type],
            max_tokens=mask.shape[1],
        ).loss
    return want_entropy, surrogate


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo", "grpo"])
def test_the_entropy_bonus_is_the_mean_token_entropy_times_its_weight(loss_type):
    """The update's loss is the surrogate minus entropy_coef times the mean entropy of the
    sampling distribution over the completion tokens, a plain token mean whatever the loss
    type (TRL's entropy_coef), the entropy computed here from the full logits; checked for two
    consecutive batches. Without a bonus, a measured update (a logged step's) reports the same
    entropy (TRL's figure) and a loss without it; an update that is not measured reports none."""
    args = grpo.GRPOCommandConfig(**FAST, entropy_coef=0.2, loss_type=loss_type)
    setup = grpo.build(args)
    batch = setup.loop.slots[0]
    for _ in range(2):
        setup.generator(batch)
        want_entropy, surrogate = _entropy_and_surrogate(setup, args, batch, loss_type)
        metrics = grpo.grpo_update(
            grpo.UpdateContext(
                setup.decoder, setup.optimizer, args, setup.vocab, setup.group_index
            ),
            batch,
            False,
        )
        torch.testing.assert_close(metrics["entropy"], want_entropy, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            metrics["loss"], surrogate - 0.2 * want_entropy, rtol=1e-5, atol=1e-6
        )
    plain = dataclasses.replace(args, entropy_coef=0.0)
    context = grpo.UpdateContext(
        setup.decoder, setup.optimizer, plain, setup.vocab, setup.group_index
    )
    want_entropy, surrogate = _entropy_and_surrogate(setup, plain, batch, loss_type)
    measured = grpo.grpo_update(context, batch, False, measure=True)
    torch.testing.assert_close(measured["entropy"], want_entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(measured["loss"], surrogate, rtol=1e-5, atol=1e-6)
    quiet = grpo.grpo_update(context, batch, False, measure=False)
    assert "entropy" not in quiet  # not computed, so not reported
    assert "grad_norm" not in quiet and not any(k.startswith("clip_ratio/") for k in quiet)


def test_tiny_model_learns_copy():
    """Chance is about 0.1 (1 in 8 letters per position). With the defaults (generation a
    version ahead, lr 1.1e-3, entropy bonus 0.05) the median run over five seeds, none of them
    tuned on, reaches a mean reward of 0.7 over ten steps within 200 steps (measured: 4 of 5
    seeds, in 149-180 steps; the last ten steps' means 0.54-0.96, median 0.94)."""
    first, last = [], []
    for seed in (2, 3, 4, 5, 6):
        rewards = grpo.train(
            grpo.GRPOCommandConfig(steps=200, watch_syncs=False, log_interval=50, seed=seed)
        ).rewards
        first.append(sum(rewards[:10]) / 10)
        last.append(sum(rewards[-10:]) / 10)
    assert max(first) < 0.2, first  # every run starts at chance
    assert statistics.median(last) > 0.7, last
    assert sum(x > 0.7 for x in last) >= 3, last  # the success rate: most seeds, not one


def test_no_unintended_sync_in_an_update_or_a_decode_step():
    args = grpo.GRPOCommandConfig(**dict(FAST, watch_syncs=True))
    result = grpo.train(args)
    assert result.syncs_per_update == 0, result.sync_sites
    assert result.syncs_per_decode_step == 0, result.sync_sites


def _reward_raises(prompts, completions, **kw):
    raise RuntimeError("the reward server is down")


def _reward_wrong_length(prompts, completions, **kw):
    return [0.0]


def _reward_inf(prompts, completions, **kw):
    return [float("inf")] * len(completions)


def _reward_text(prompts, completions, **kw):
    return ["1.0"] * len(completions)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(task="nope"), "unknown task 'nope'"),
        (dict(model="/no/such/model"), "neither a built-in"),
        (dict(num_generations=1), "--num-generations must be at least 2"),
        (dict(max_new_tokens=70), "exceed the model's context of 64"),
        (dict(loss_type="ppo"), "--loss-type must be one of"),
        (dict(temperature=0.0), "--temperature must be a positive"),
        (dict(learning_rate=float("nan")), "--learning-rate must be a positive"),
        (dict(top_p=1.5), "--top-p must lie in"),
        (dict(entropy_coef=-0.1), "--entropy-coef must be a finite number >= 0"),
        (dict(entropy_coef=float("inf")), "--entropy-coef must be a finite number >= 0"),
        (dict(entropy_coef=float("nan")), "--entropy-coef must be a finite number >= 0"),
        (dict(reward="tests.algos.grpo.test_grpo:missing"), "has no function 'missing'"),
        (dict(reward="nomodule_xyz:f"), "cannot import"),
        (
            dict(reward="tests.algos.grpo.test_grpo:_reward_raises", reward_weights="a"),
            "--reward-weights must be numbers",
        ),
    ],
)
def test_bad_input_is_named(change, message):
    with pytest.raises(ValueError, match=message):
        grpo.build(grpo.GRPOCommandConfig(**dict(FAST, **change)))


@pytest.mark.parametrize(
    "reward,message",
    [
        ("_reward_wrong_length", "returned 1 values for 16 completions"),
        ("_reward_inf", "returned inf for completion 0"),
        ("_reward_text", "_reward_text returned '1.0' for completion 0 \\(a number or None"),
        ("_reward_raises", "the reward server is down"),
    ],
)
def test_a_failing_reward_stops_the_run_with_its_cause(reward, message):
    args = grpo.GRPOCommandConfig(**dict(FAST, reward=f"tests.algos.grpo.test_grpo:{reward}"))
    with pytest.raises(nostall.runtime.RuntimeStopped, match=message) as info:
        grpo.train(args)
    assert info.value.__cause__ is not None  # the reward's own traceback is chained


def test_tokenizer_without_eos_is_refused(tmp_path):
    from nostall.lm.models import builtin_model, load_model

    lm = builtin_model("tiny")
    lm.model.save_pretrained(tmp_path)
    tok = copy.deepcopy(lm.tokenizer)
    tok.eos_token = None
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no <eos> token"):
        load_model(str(tmp_path))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("staleness,inflight", [(0, False), (1, False), (1, True)])
def test_trains_on_a_gpu(staleness, inflight):
    result = grpo.train(
        grpo.GRPOCommandConfig(
            **dict(FAST, watch_syncs=True),
            device="cuda",
            staleness=staleness,
            inflight_weights=inflight,
        )
    )
    assert len(result.rewards) == FAST["steps"]
    assert result.syncs_per_update == 0, result.sync_sites
