"""Any `transformers` causal LM, through its own forward: the path for every architecture the
lean Llama-family forward (decoder.py) does not reproduce (Qwen3, Gemma2 and 3, Phi3, GPT-2,
OLMo2, Mistral with a sliding window, ...), with the same interface, so generation, the update and
checkpoints do not care which one runs.

- Training: the model's base module gives the final hidden states of prompt + completion (its
  own masks, positions and attention), and the loss takes the log-probs from them and the output
  weight in chunks (`token_log_prob_linear`): [B, T, V] logits are never built.
- Generation: the model's own KV cache, prompts run once per group and the cache repeated to
  the group, one forward a token with explicit positions and the attention mask the engine
  keeps; sampled with `sample_tokens` as on the lean path, no host read a token. The cache is a
  `StaticCache` (every slot allocated once, each token written in place) where the model
  supports one, as every architecture above does: a `DynamicCache` copies its whole self into
  a new tensor every token (at 1,024-token completions, about half a terabyte of copies a
  batch for a 0.5B model's 64 rows) and grows the heap as it goes.

`make_decoder` picks the lean forward where it applies and this one everywhere else.
"""

from __future__ import annotations

import torch

from nostall.lm.decoder import Decoder, supports
from nostall.lm.lora import is_peft

Tensor = torch.Tensor


class HFCache:
    """The model's own cache for one batch, and how many positions it holds (a host count,
    so a step's attention mask is sliced without reading the device). `slots`: the positions
    a static cache holds (prompt + completion); None: a dynamic one."""

    def __init__(self, slots: int | None):
        self.slots = slots
        self.cache = None
        self.length = 0


def supports_static_cache(model: torch.nn.Module) -> bool:
    """Whether the model's forward runs over a `StaticCache` (transformers marks the models
    whose forward is static-shape end to end)."""
    return bool(getattr(model, "_can_compile_fullgraph", False))


def _repeat_static(cache, repeats: int) -> None:
    """A static cache's rows repeated `repeats` times each (prompt rows to their group's):
    transformers' batch_repeat_interleave, which its static layers lack."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(repeats, 0)
        layer.values = layer.values.repeat_interleave(repeats, 0)
        layer.batch_size = layer.keys.shape[0]


def _text_config(model: torch.nn.Module):
    """The language model's config (a multimodal model's text part)."""
    config = model.config
    return getattr(config, "get_text_config", lambda: config)()


def plain_head(model: torch.nn.Module) -> str | None:
    """Why the model's logits are not `hidden @ output_weight.T`, soft-capped or not (then the
    chunked log-probs would be other probabilities than its own), or None when they are."""
    text = _text_config(model)
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        return f"its output layer is a {type(head).__name__}, not a linear layer"
    if head.bias is not None:
        return "its output layer has a bias"
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(text, name, None)
        if value not in (None, 1, 1.0, 0, 0.0):
            return f"its logits are transformed ({name} = {value})"
    return None


class HFDecoder:
    """The `Decoder` interface over the model's own forward (see the module's docstring)."""

    native = False
    # (transformers' masks are built on the host each step: no CUDA graph of the decode step
    # until one is shown to capture; the static cache is the half of it in place.)
    graphable = False

    def __init__(self, model: torch.nn.Module, static_cache: bool | None = None):
        """`model`: a causal LM, or a `peft` model around one (its adapters in its layers).
        `static_cache`: generate over a StaticCache (None: where the model supports one)."""
        inner = model.get_base_model() if is_peft(model) else model
        reason = plain_head(inner)
        if reason is not None:
            raise ValueError(
                f"model type {getattr(inner.config, 'model_type', '?')!r}: {reason}; "
                "nostall computes log-probs from the final hidden states and the "
                "output weight, which would not be this model's"
            )
        self.model = model  # (whose state the weights published and checkpointed are)
        self.inner = inner
        # Gemma2's cap * tanh(logits / cap): the loss's log-probs apply it (nostall.lm.softcap);
        # generation samples from the model's own logits, capped by its forward.
        self.softcap = getattr(_text_config(inner), "final_logit_softcapping", None) or None
        self.base = inner.base_model  # the final hidden states, normalised
        supported = supports_static_cache(inner)
        if static_cache and not supported:
            raise ValueError(f"{type(inner).__name__} does not support a static cache")
        self.static_cache = supported if static_cache is None else static_cache

    @property
    def output_weight(self) -> Tensor:
        return self.inner.get_output_embeddings().weight

    # The lean forward's hooks the engine calls: nothing to fuse, no native op.
    def freeze(self) -> None:
        pass

    def _native_applies(self) -> bool:
        return False

    def _native_training_applies(self, length: int | None = None) -> bool:
        return False

    # -- training ------------------------------------------------------------------------------
    def grouped_hidden(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
    ) -> Tensor:
        """[B, C, H]: the hidden states that predict each completion token, differentiable
        (each row's prompt and completion in one forward of the model)."""
        Bp, P = prompt_ids.shape
        G = completion_ids.shape[0] // Bp
        ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], 1)
        mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        hidden = self.base(
            input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=False
        ).last_hidden_state
        C = completion_ids.shape[1]
        return hidden[:, P - 1 : P + C - 1]

    # -- generation ----------------------------------------------------------------------------
    def new_cache(self, batch: int, slots: int) -> HFCache:
        return HFCache(slots if self.static_cache else None)

    def prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, cache: HFCache, group_size: int = 1
    ) -> Tensor:
        """Each group's prompt [Bp, P] run once, its cache repeated to the group's G rows; the
        next-token logits [Bp * G, V]."""
        from transformers import DynamicCache, StaticCache

        P = prompt_ids.shape[1]
        positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)
        mask = prompt_mask.long()
        if cache.slots is not None:  # (its mask spans every slot; those past P are unwritten)
            fresh = StaticCache(config=self.inner.config, max_cache_len=cache.slots)
            mask = torch.nn.functional.pad(mask, (0, cache.slots - P))
        else:
            fresh = DynamicCache(config=self.inner.config)
        out = self.inner(
            input_ids=prompt_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=fresh,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.cache = out.past_key_values
        if group_size > 1 and cache.slots is not None:
            _repeat_static(cache.cache, group_size)
        elif group_size > 1:  # (DynamicCache's own)
            cache.cache.batch_repeat_interleave(group_size)
        cache.length = P
        return out.logits[:, -1].repeat_interleave(group_size, 0)

    def decode(
        self, token: Tensor, position: Tensor, slot: Tensor, slot_mask: Tensor, cache: HFCache
    ) -> Tensor:
        """One step: token and position [B]; slot_mask [B, S] the keys this step may attend to
        (its own slot included; `slot` is the host count's twin, not read). The logits [B, V]."""
        mask = slot_mask if cache.slots is not None else slot_mask[:, : cache.length + 1]
        out = self.inner(
            input_ids=token[:, None],
            attention_mask=mask.long(),
            position_ids=position[:, None],
            past_key_values=cache.cache,
            use_cache=True,
        )
        cache.cache = out.past_key_values
        cache.length += 1
        return out.logits[:, -1]


def checkpointed(model: torch.nn.Module) -> HFDecoder:
    """The model's own forward with transformers' gradient checkpointing."""
    return HFDecoder(enable_checkpointing(model))


def enable_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with transformers' gradient checkpointing on (which acts in training mode:
    every dropout is set to 0 so the trainer's log-probs stay the generator's)."""
    inner = model.get_base_model() if is_peft(model) else model
    if not getattr(inner, "supports_gradient_checkpointing", False):
        raise ValueError(f"--gradient-checkpointing: {type(inner).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(inner, "activation_checkpointing_enable"):  # (transformers >= 5.23's name)
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def make_decoder(model: torch.nn.Module) -> Decoder | HFDecoder:
    """The lean Llama-family forward where it reproduces the model (decoder.supports; not with
    LoRA adapters, which it would not see), its own forward everywhere else."""
    return Decoder(model) if not is_peft(model) and supports(model) else HFDecoder(model)
