"""The GRPO update without autograd: the forward, the loss and each adjoint called in turn as
native ops, the gradients written straight into the optimizer's flat buffer.

Why: on the race's tiny model the autograd graph of an update cost about 2 ms of 5. That is the
Python autograd formula of `decoder_train` and torch.library's pytree wrapping of it, the cats
of each layer's q/k/v and gate/up weights and their backward nodes, the vocabulary slice, and
27 gradient accumulations. It also held the GIL while the generator thread waited for it. Here
an update is a dozen op calls.

What removes the cats: ClippedAdam keeps every parameter as a view of one flat buffer, in the
order it is given. `training_order` lists the parameters in the order of
`decoder_train_backward`'s outputs: the embedding, each layer's input norm, each layer's q, k, v
weights, their biases, the output projections, the post-attention norms, gate and up weights,
down weights, the final norm, then an untied output weight. So each layer's fused q/k/v (and
gate/up) weight is one contiguous view of the flat parameters, and the op's gradients, laid end
to end, are the flat gradient: `decoder_train_backward_into` writes them there (no gradient
tensor is allocated: they are the size of the model, and a second copy of them was the update's
peak memory).

The same arithmetic as `policy_log_probs` + `grpo_loss` + `loss.backward()`, in the same ops:
tests check the two against each other (tests/algos/grpo/test_explicit_update.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from nostall.algos.grpo.config import AGGREGATIONS
from nostall.algos.grpo.loss import NO_CAP, behaviour_for_loss, token_mean
from nostall.decoder_weights import DecoderWeights
from nostall.lm.decoder import Decoder
from nostall.lm.generation import SampledVocab
from nostall.lm.packing import training_order
from nostall.ops.losses import DEFAULT_CHUNK_LOGITS
from nostall.optim import ClippedAdam

Tensor = torch.Tensor


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a pass, as the explicit gradients take it: its rows, their advantages
    and loss tokens, the log-probs of the policy the ratio is taken against (None: this pass's
    own, the proximal policy), and how its gradient joins the optimizer's (times `scale`, added
    with `accumulate`, else replacing it)."""

    batch: Any
    advantage: Tensor
    loss_mask: Tensor
    old_log_prob: Tensor | None
    scale: float = 1.0
    accumulate: bool = False


class ExplicitUpdate:
    """GRPO optimizer steps by explicit adjoints, for a decoder whose optimizer holds its
    parameters in `training_order` (see `applies`)."""

    def __init__(self, decoder: Decoder, optimizer: ClippedAdam):
        self.decoder, self.optimizer = decoder, optimizer
        layers = decoder.layers
        with torch.no_grad():  # views of the packed parameters (Decoder._fuse)
            fused = [decoder._fuse(layer) for layer in layers]
        for (qkv, _, gate_up), layer in zip(fused, layers, strict=True):
            if (
                qkv.data_ptr() != layer.self_attn.q_proj.weight.data_ptr()
                or gate_up.data_ptr() != layer.mlp.gate_proj.weight.data_ptr()
            ):
                raise ValueError("ExplicitUpdate needs the parameters packed in training_order")
        # decoder_train's weight arguments: views of the flat buffer, valid for every step.
        weights = DecoderWeights.of(decoder, fused).detached()
        self.qkv, self.qkv_bias, self.gate_up = (
            weights.qkv_weight,
            weights.qkv_bias,
            weights.gate_up_weight,
        )
        self.weights = (*weights, *decoder.native_tables)
        self.config = decoder._native_config()
        self.tied = decoder.output_weight is decoder.embed.weight
        # The gradients: the optimizer's views. decoder_train_backward's outputs, end to end,
        # are the flat gradient but for an untied output weight's rows at its end.
        self.output_grad = decoder.output_weight.grad
        untied = 0 if self.tied else decoder.output_weight.numel()
        flat = optimizer.flat_gradient
        self.decoder_grad = flat[: flat.numel() - untied]

    @staticmethod
    def applies_now(decoder: Decoder, reference: Decoder | None, length: int | None = None) -> bool:
        """The native training forward runs (on the CPU, float32 or bf16 weights, completions
        of `length` tokens) and there is no KL reference (its log-probs would need their own
        forward): checked every update."""
        return reference is None and decoder._native_training_applies(length)

    @staticmethod
    def applies(decoder: Decoder, optimizer, reference: Decoder | None) -> bool:
        """`applies_now`, and the optimizer's flat buffers lie in `training_order`."""
        if not ExplicitUpdate.applies_now(decoder, reference):
            return False
        # A ClippedAdam with its gradient buffer, or MasterWeights (the compute copy's).
        if getattr(optimizer, "flat_gradient", None) is None:
            return False
        order = training_order(decoder)
        return order is not None and [id(p) for p in order] == [
            id(p) for p in optimizer.parameters_in_order
        ]

    @torch.no_grad()
    def gradients(
        self,
        micro: MicroBatch,
        args,
        vocab: SampledVocab | None,
        decoupled: bool,
        measure: bool = False,
    ) -> tuple[Tensor, ...]:
        """The gradient of the loss on `micro` (its tokens in its loss_mask), times its scale,
        into the optimizer's flat gradient (added to it with `accumulate`, else replacing it):
        (log_prob, loss, clip_fraction, approx_kl, entropy), the log-probs before the step, the
        entropy's mean over the loss's tokens (None without an entropy bonus, unless
        `measure`: then taken, not trained on). `decoupled`: the loss weighs each token by the
        behaviour ratio."""
        batch, advantage, loss_mask = micro.batch, micro.advantage, micro.loss_mask
        old_log_prob, scale, accumulate = micro.old_log_prob, micro.scale, micro.accumulate
        d = self.decoder
        G = args.num_generations
        B, C = batch.completion_ids.shape
        prompt_ids, prompt_mask = batch.prompt_ids[::G], batch.prompt_mask[::G]
        weights, config = self.weights, self.config
        hidden, *saved = torch.ops.nostall.decoder_train.default(
            prompt_ids,
            prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            *weights,
            *config,
        )
        # (At temperature 1 the division is exact: skipped, with its twin in the backward.)
        unit = args.temperature == 1.0
        scaled = hidden.view(B, C, -1) if unit else hidden.view(B, C, -1) / args.temperature
        weight, tokens = d.output_weight.detach(), batch.completion_ids
        scaled = scaled.to(weight.dtype)  # (the states are float32 over bf16 weights too)
        if vocab is not None:  # the softmax over the allowed tokens' rows only
            weight, tokens = weight[vocab.ids], vocab.index[tokens]
        chunk = max(1, DEFAULT_CHUNK_LOGITS // weight.shape[0])
        log_prob, logsumexp = torch.ops.nostall.token_log_prob_linear.default(
            scaled, weight, tokens, chunk
        )
        if old_log_prob is None:
            old_log_prob = log_prob
        aggregation = AGGREGATIONS[args.loss_type]
        clip_high = args.clip_low if args.clip_high is None else args.clip_high
        behaviour, is_cap = None, NO_CAP
        if decoupled:
            behaviour, is_cap = behaviour_for_loss(old_log_prob, batch.log_probs, loss_mask, args)
        loss, clip_fraction, approx_kl, token_grad = torch.ops.nostall.clipped_policy_loss.default(
            log_prob,
            old_log_prob,
            advantage,
            loss_mask,
            float(args.clip_low),
            float(clip_high),
            aggregation,
            C,
            None,
            behaviour,
            float(is_cap),
        )
        grad_log_prob = torch.ops.nostall.clipped_policy_loss_backward.default(
            torch.full_like(loss, scale), token_grad, loss_mask, aggregation, C
        )
        grad_scaled, grad_weight = torch.ops.nostall.token_log_prob_linear_backward.default(
            grad_log_prob, scaled, weight, tokens, logsumexp, chunk
        )
        entropy = None
        if args.entropy_coef:  # the bonus -coef * entropy, a plain mean over the tokens (TRL's)
            entropy, entropy_lse = torch.ops.nostall.token_entropy_linear.default(
                scaled, weight, chunk
            )
            mask = loss_mask.to(entropy.dtype)
            grad_entropy = mask * (-args.entropy_coef * scale / mask.sum().clamp(min=1))
            grad_h, grad_w = torch.ops.nostall.token_entropy_linear_backward.default(
                grad_entropy, scaled, weight, entropy, entropy_lse, chunk
            )
            grad_scaled += grad_h
            grad_weight += grad_w
            entropy = token_mean(entropy, loss_mask)
            loss = loss - args.entropy_coef * entropy
        elif measure:  # (one more pass over the vocabulary, no backward)
            rows, _ = torch.ops.nostall.token_entropy_linear.default(scaled, weight, chunk)
            entropy = token_mean(rows, loss_mask)
        # Every decoder gradient straight into the flat buffer (set, or added when accumulating).
        torch.ops.nostall.decoder_train_backward_into.default(
            (grad_scaled if unit else grad_scaled / args.temperature).view(B * C, -1).float(),
            prompt_ids,
            prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            *weights,
            *saved,
            *config,
            self.decoder_grad,
            accumulate,
        )
        output_grad = self.output_grad  # (tied: the embedding's, which has its token rows)
        if not self.tied and not accumulate:
            output_grad.zero_()
        if vocab is not None:
            output_grad.index_add_(0, vocab.ids, grad_weight)
        else:
            output_grad.add_(grad_weight)
        return log_prob, loss, clip_fraction, approx_kl, entropy


# Each optimizer's update by explicit adjoints, with the decoder it was built for (None where
# it does not apply): built on the first update, not once per step.
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def explicit_update(decoder: Decoder, optimizer, reference: Decoder | None, length: int):
    """The ExplicitUpdate of this decoder and optimizer for completions of `length` tokens, or
    None where it does not apply."""
    if not ExplicitUpdate.applies_now(decoder, reference, length):
        return None
    built = _BUILT.get(optimizer)
    if built is None or built[0] is not decoder:
        update = None
        if ExplicitUpdate.applies(decoder, optimizer, reference):
            update = ExplicitUpdate(decoder, optimizer)
        built = _BUILT[optimizer] = (decoder, update)
    return built[1]
