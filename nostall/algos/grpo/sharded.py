"""One trainer rank of GRPO's `--trainers M`: the model sharded by FSDP2 over the M ranks,
the update on this rank's share of every micro-batch.

Each decoder layer is a `fully_shard` unit, and the root unit is a PolicyTerms module around
the whole model (embeddings, final norm and the output weight, tied or not), whose forward
runs the model's own forward (HFDecoder) to the final hidden states and the chunked head to
the log-probs: a sharded module's parameters are whole only inside its forward and backward,
and GRPO's head reads the output weight beside the base model's call. Parameters, gradients
and the optimizer's moments are each held 1/M a rank; with a bf16 run the layers are gathered
and computed in bf16 over float32 shards, gradients reduced in float32 (FSDP2's mixed
precision: the sharded counterpart of the single rank's master weights).

A step is GRPO's update (grpo_update with `rank`), its gradients averaged over the ranks by
FSDP's reduce-scatter, then clipped by their global norm and stepped by torch's AdamW:
ClippedAdam's arithmetic (decoupled decay, then Adam with its eps and betas), with its
state_dict's per-parameter entries, so checkpoints move between M ranks and one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor

from nostall.algos.grpo.config import GRPOConfig
from nostall.algos.grpo.loss import PolicyTerms
from nostall.algos.grpo.update import UpdateContext, grpo_update
from nostall.lm.batch import LMBatch
from nostall.lm.generation import SampledVocab
from nostall.lm.hf_decoder import enable_checkpointing

# Adam's per-parameter state, as ClippedAdam's state_dict holds it.
MOMENTS = ("exp_avg", "exp_avg_sq")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, each an FSDP unit: the classes transformers names as not to
    be split (`_no_split_modules`, every decoder layer)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"--trainers: cannot find the decoder layers of {type(model).__name__} "
            "(it names no _no_split_modules) to shard"
        )
    return layers


class ShardedAdam:
    """The optimizer interface grpo_update steps, over sharded parameters: the global
    gradient norm clipped (clip_grad_norm_ over every rank's shards), then torch's AdamW."""

    def __init__(self, params: list[torch.nn.Parameter], args: GRPOConfig):
        self.params = params
        self.max_grad_norm = args.max_grad_norm
        self.optimizer = torch.optim.AdamW(
            params,
            lr=args.learning_rate_at(1),
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            foreach=True,
            weight_decay=args.weight_decay,
        )

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def collect_gradients(self) -> None:
        """(The gradients land reduced in the shards' .grad: nothing to collect.)"""

    def apply_gradients(self, measure: bool = False) -> torch.Tensor | None:
        """The step; with `measure`, the global gradient norm before clipping (every rank's)."""
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        if not measure:
            return None
        # (A DTensor over sharded parameters: its whole value, a collective every rank takes.)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _reduce_op(name: str):
    if name.endswith(("/max", "_max")):
        return dist.ReduceOp.MAX
    if name.endswith(("/min", "_min")):
        return dist.ReduceOp.MIN
    return dist.ReduceOp.SUM


@dataclass(frozen=True)
class RankUpdate:
    """What every rank's update computes with besides its config: the run's compute dtype, the
    sampler's vocabulary (None: all tokens), <eos> (for mask_truncated_completions) and whether
    the loss weighs tokens by the behaviour ratio (setup.corrects_behaviour)."""

    compute_dtype: torch.dtype
    vocab: SampledVocab | None
    eos_token_id: int | None
    decoupled: bool

    def to(self, device: torch.device) -> RankUpdate:
        """The same, its vocabulary's tensors on `device`."""
        if self.vocab is None:
            return self
        vocab = SampledVocab(self.vocab.ids.to(device), self.vocab.index.to(device))
        return dataclasses.replace(self, vocab=vocab)


class ShardedTrainer:
    """This process's rank of `world` (torch.distributed's default group joined already):
    `model` (a whole float32 or master-dtype copy, sharded in place), its optimizer, and the
    update of its share of a batch; `reference` (--beta's, a whole copy) is sharded too."""

    def __init__(
        self,
        model: torch.nn.Module,
        args: GRPOConfig,
        rank: int,
        world: int,
        update: RankUpdate,
        device: torch.device,
        reference: torch.nn.Module | None = None,
    ):
        self.args, self.rank, self.world = args, rank, world
        self.vocab, self.eos_token_id = update.vocab, update.eos_token_id
        self.decoupled = update.decoupled
        compute_dtype = update.compute_dtype
        if device.type == "cuda":  # (the mesh would pick rank % GPUs seen, not this one)
            index = torch.cuda.current_device() if device.index is None else device.index
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
        if args.gradient_checkpointing:  # (each layer's recompute inside its FSDP unit)
            enable_checkpointing(model)
        mesh = init_device_mesh(device.type, (world,))
        master = next(model.parameters()).dtype
        mixed = MixedPrecisionPolicy(
            param_dtype=compute_dtype if compute_dtype != master else None,
            reduce_dtype=torch.float32,
        )
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mixed)
        self.terms = fully_shard(PolicyTerms(model), mesh=mesh, mp_policy=mixed)
        # --beta's reference model, frozen, sharded the same way (in the compute dtype already):
        # each rank holds 1/M of it, and its forward gathers a layer at a time.
        self.reference = None
        if reference is not None:
            reference = reference.to(device).requires_grad_(False)
            for layer in decoder_layers(reference):
                fully_shard(layer, mesh=mesh)
            self.reference = fully_shard(PolicyTerms(reference), mesh=mesh)
        # The model's own parameter names (the root's "model." prefix off), in one order on
        # every rank: the collectives below go through them in it.
        self.named = [(name.removeprefix("model."), p) for name, p in self.terms.named_parameters()]
        self.optimizer = ShardedAdam([p for _, p in self.named], args)
        self.group_index = torch.arange(args.num_prompts, device=device).repeat_interleave(
            args.num_generations
        )

    def update(self, batch: LMBatch, lr: float, measure: bool = True) -> dict[str, torch.Tensor]:
        """GRPO's update on this rank's share of `batch` (the whole batch, on every rank);
        the metrics over every rank's share (means; maxima and minima of /max and /min)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        context = UpdateContext(
            self.terms,
            self.optimizer,
            self.args,
            self.vocab,
            self.group_index,
            self.reference,
            self.eos_token_id,
            rank=(self.rank, self.world),
            autograd=True,
        )
        metrics = grpo_update(context, batch, self.decoupled, measure)
        reduced = {}
        for name, value in metrics.items():
            value = value.detach().float().clone()
            dist.all_reduce(value, op=_reduce_op(name))
            reduced[name] = value / self.world if _reduce_op(name) == dist.ReduceOp.SUM else value
        return reduced

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every trained parameter whole (an all-gather each: every rank calls it), by name;
        frozen ones (LoRA's base weights) never change, so are not gathered."""
        with torch.no_grad():
            return {name: p.full_tensor() for name, p in self.named if p.requires_grad}

    def full_optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Adam's state of every parameter, whole (every rank calls it), by name; empty before
        the first step."""
        state = {}
        for name, p in self.named:
            entry = self.optimizer.optimizer.state.get(p)
            if entry:
                state[name] = {
                    "step": entry["step"].clone(),
                    **{k: entry[k].full_tensor() for k in MOMENTS},
                }
        return state

    def load_optimizer_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """full_optimizer_state's form (whole tensors, on every rank): each rank keeps its
        shard of each (no communication)."""
        for name, p in self.named:
            if name not in state:
                continue
            entry = state[name]
            self.optimizer.optimizer.state[p] = {
                "step": entry["step"].float().clone(),  # (a host scalar, as AdamW keeps it)
                **{
                    k: distribute_tensor(
                        entry[k].to(p.device, p.dtype),
                        p.device_mesh,
                        p.placements,
                        src_data_rank=None,
                    )
                    for k in MOMENTS
                },
            }
