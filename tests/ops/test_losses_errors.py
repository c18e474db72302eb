"""Bad input to the loss ops: a clear error naming the argument, eager and compiled (where the
fake kernels must reject the same input with the same message)."""

import pytest
import torch

import nostall
from tests.ops.losses_data import grouped_rewards, logits_batch, token_batch


def _run(fn, compiled, *args, **kwargs):
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    return fn(*args, **kwargs)


COMPILED = pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])


def group_args(**override):
    reward, index = grouped_rewards([2, 3], dtype=torch.float32, seed=1)
    args = dict(reward=reward, group_index=index, num_groups=2, scale="group", eps=1e-4)
    args.update(override)
    return args


BAD_GROUP = [
    ("reward_2d", dict(reward=torch.zeros(5, 1)), "reward must be a 1-D"),
    ("reward_int", dict(reward=torch.zeros(5, dtype=torch.int64)), "reward must be float32"),
    (
        "reward_empty",
        dict(reward=torch.zeros(0), group_index=torch.zeros(0, dtype=torch.int64)),
        "reward must hold at least one",
    ),
    ("index_float", dict(group_index=torch.zeros(5)), "group_index must be int64"),
    (
        "index_shape",
        dict(group_index=torch.zeros(4, dtype=torch.int64)),
        "group_index must have the shape of reward",
    ),
    ("num_groups_zero", dict(num_groups=0), "num_groups must be >= 1"),
    (
        "num_groups_overflow",  # (2**62 + 1) * 3 statistics wrap int64
        dict(num_groups=2**62),
        r"num_groups = 4611686018427387904 is too large: \(num_groups \+ 1\) \* 3 statistics",
    ),
    ("eps_negative", dict(eps=-1.0), "eps must be a finite number >= 0"),
    ("eps_nan", dict(eps=float("nan")), "eps must be a finite number >= 0"),
    ("scale_unknown", dict(scale="std"), "scale must be 'group', 'batch' or 'none', got 'std'"),
]


@COMPILED
@pytest.mark.parametrize("case,override,message", BAD_GROUP, ids=[c[0] for c in BAD_GROUP])
def test_group_advantages_rejects(case, override, message, compiled):
    with pytest.raises(RuntimeError, match=message):
        _run(nostall.group_advantages, compiled, **group_args(**override))


@pytest.mark.parametrize("bad", [-1, 2, 100])
def test_group_index_out_of_range_is_named_with_its_position(bad):
    args = group_args()
    args["group_index"] = args["group_index"].clone()
    args["group_index"][3] = bad
    with pytest.raises(RuntimeError, match=rf"group_index\[3\] = {bad} is outside \[0, num_groups"):
        nostall.group_advantages(**args)


def test_group_advantages_backward_checks_its_gradient():
    reward, index = grouped_rewards([2, 2], seed=2)
    with pytest.raises(RuntimeError, match="grad_advantage must have the shape of reward"):
        torch.ops.nostall.group_advantages_backward(
            torch.zeros(3, dtype=torch.float64), reward, index, 2, "group", 1e-4
        )


def logits_args(**override):
    logits, tokens = logits_batch(2, 3, 10, seed=3)
    args = dict(logits=logits, tokens=tokens)
    args.update(override)
    return args


BAD_LOGITS = [
    ("logits_2d", dict(logits=torch.zeros(2, 10)), "logits must be \\[B, T, V\\]"),
    (
        "logits_half",
        dict(logits=torch.zeros(2, 3, 10, dtype=torch.float16)),
        "logits must be float32, float64 or bfloat16",
    ),
    ("logits_int", dict(logits=torch.zeros(2, 3, 10, dtype=torch.int32)), "logits must be float"),
    ("vocab_empty", dict(logits=torch.zeros(2, 3, 0)), "vocabulary of at least one token"),
    ("tokens_int32", dict(tokens=torch.zeros(2, 3, dtype=torch.int32)), "tokens must be int64"),
    (
        "tokens_shape",
        dict(tokens=torch.zeros(3, 2, dtype=torch.int64)),
        "tokens must be \\[B, T\\] = \\[2, 3\\], matching logits",
    ),
]


@COMPILED
@pytest.mark.parametrize("case,override,message", BAD_LOGITS, ids=[c[0] for c in BAD_LOGITS])
def test_token_log_prob_rejects(case, override, message, compiled):
    with pytest.raises(RuntimeError, match=message):
        _run(nostall.token_log_prob, compiled, **logits_args(**override))


@pytest.mark.parametrize("bad", [-1, 10, 1 << 40])
def test_token_out_of_range_is_refused(bad):
    args = logits_args()
    args["tokens"][1, 2] = bad
    with pytest.raises(
        RuntimeError, match=rf"tokens must lie in \[0, V = 10\), got tokens\[flat index 5\] = {bad}"
    ):
        nostall.token_log_prob(**args)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 3, 4, generator=g)
    weight = torch.randn(10, 4, generator=g)
    with pytest.raises(RuntimeError, match="tokens must lie in \\[0, V = 10\\)"):
        nostall.token_log_prob_linear(hidden, weight, args["tokens"])


def linear_args(**override):
    g = torch.Generator().manual_seed(5)
    args = dict(
        hidden=torch.randn(2, 3, 4, generator=g),
        weight=torch.randn(10, 4, generator=g),
        tokens=torch.randint(0, 10, (2, 3), generator=g),
        chunk_size=2,
    )
    args.update(override)
    return args


BAD_LINEAR = [
    ("hidden_2d", dict(hidden=torch.zeros(6, 4)), "hidden must be \\[B, T, H\\]"),
    ("hidden_half", dict(hidden=torch.zeros(2, 3, 4, dtype=torch.float16)), "hidden must be float"),
    ("weight_h", dict(weight=torch.zeros(10, 5)), "weight must be \\[V, H\\] with H = 4"),
    (
        "weight_dtype",
        dict(weight=torch.zeros(10, 4, dtype=torch.float64)),
        "weight must have the dtype of hidden",
    ),
    (
        "tokens_shape",
        dict(tokens=torch.zeros(2, 4, dtype=torch.int64)),
        "tokens must be \\[B, T\\] = \\[2, 3\\], matching hidden",
    ),
    ("chunk_zero", dict(chunk_size=0), "chunk_size must be >= 1, got 0"),
]


@COMPILED
@pytest.mark.parametrize("case,override,message", BAD_LINEAR, ids=[c[0] for c in BAD_LINEAR])
def test_token_log_prob_linear_rejects(case, override, message, compiled):
    with pytest.raises(RuntimeError, match=message):
        _run(nostall.token_log_prob_linear, compiled, **linear_args(**override))


def loss_args(**override):
    lp, old, _beh, adv, mask = token_batch(3, 4, dtype=torch.float32, seed=6)
    args = dict(
        log_prob=lp,
        old_log_prob=old,
        advantage=adv,
        mask=mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="token_mean",
        max_tokens=4,
    )
    args.update(override)
    return args


BAD_LOSS = [
    ("log_prob_1d", dict(log_prob=torch.zeros(3)), "log_prob must be \\[B, T\\]"),
    (
        "log_prob_bf16",
        dict(log_prob=torch.zeros(3, 4, dtype=torch.bfloat16)),
        "log_prob must be float32 or float64",
    ),
    (
        "old_shape",
        dict(old_log_prob=torch.zeros(3, 5)),
        "old_log_prob must be \\[B, T\\] = \\[3, 4\\], matching log_prob",
    ),
    (
        "old_dtype",
        dict(old_log_prob=torch.zeros(3, 4, dtype=torch.float64)),
        "old_log_prob must have the dtype of log_prob",
    ),
    ("advantage_3d", dict(advantage=torch.zeros(3, 4, 1)), "advantage must be \\[B\\]"),
    ("advantage_len", dict(advantage=torch.zeros(2)), "advantage must be \\[B\\] = \\[3\\]"),
    ("mask_float", dict(mask=torch.ones(3, 4)), "mask must be bool, got"),
    ("mask_int", dict(mask=torch.ones(3, 4, dtype=torch.int64)), "mask must be bool, got"),
    ("mask_shape", dict(mask=torch.ones(3, 3, dtype=torch.bool)), "mask must be \\[B, T\\]"),
    ("behavior_shape", dict(behavior_log_prob=torch.zeros(3, 2)), "behavior_log_prob must be"),
    ("clip_low_negative", dict(clip_low=-0.1), "clip_low must be a finite number >= 0"),
    ("clip_high_negative", dict(clip_high=-0.2), "clip_high must be a finite number >= 0"),
    ("clip_high_inf", dict(clip_high=float("inf")), "clip_high must be a finite number >= 0"),
    ("dual_clip_low", dict(dual_clip=0.5), "dual_clip must be a finite number > 1"),
    ("is_cap_zero", dict(is_cap=0.0), "is_cap must be a finite number > 0"),
    ("aggregation", dict(aggregation="sum"), "aggregation must be 'token_mean', "),
    ("max_tokens_zero", dict(max_tokens=0), "max_tokens must be >= 1, got 0"),
]


@COMPILED
@pytest.mark.parametrize("case,override,message", BAD_LOSS, ids=[c[0] for c in BAD_LOSS])
def test_clipped_policy_loss_rejects(case, override, message, compiled):
    with pytest.raises(RuntimeError, match=message):
        _run(nostall.clipped_policy_loss, compiled, **loss_args(**override))


def test_scalars_given_as_tensors_are_refused_rather_than_synced():
    with pytest.raises(TypeError, match="clip_low must be a Python number"):
        nostall.clipped_policy_loss(**loss_args(clip_low=torch.tensor(0.2)))
    with pytest.raises(TypeError, match="max_tokens must be a Python int"):
        nostall.clipped_policy_loss(**loss_args(max_tokens=torch.tensor(4)))
    with pytest.raises(TypeError, match="num_groups must be a Python int"):
        nostall.group_advantages(**group_args(num_groups=torch.tensor(2)))
