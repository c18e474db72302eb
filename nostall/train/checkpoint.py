"""One checkpoint format for every trainer and backend.

A checkpoint file is the record {format, version, algorithm, the run's arguments, the
trainer's state} written by `torch.save` straight into the file, followed by an 80-byte trailer
holding the SHA-256 of everything before it, so a damaged file (truncated, bit-flipped, random
bytes) is refused with a clear message instead of resuming from garbage. It loads with
`torch.load(weights_only=True)`: a checkpoint from elsewhere cannot run code.

Memory: saving streams each tensor from where it lies into the file and hashes the bytes as
they pass (no in-memory copy of the state); loading checks the hash reading the file in chunks,
then maps the tensors from the file (`mmap`). Each weight is stored once: tensors with the same
contents (the trainer's weights, the published copy, the rollout side's and each Ray worker's
when they hold the same version; tied embeddings) are written once and shared on load.

A resume whose arguments conflict with the saved ones is refused, naming the fields.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch

from nostall import files

FORMAT = "nostall-checkpoint"
FORMAT_VERSION = 2
_MAGIC = b"NOSTALL-SHA256:"
_TRAILER = len(_MAGIC) + 64 + 1  # the magic, the hex digest, a newline
_READ_CHUNK = 1 << 24
_DEDUP_MIN_BYTES = 1024  # smaller tensors are not worth hashing


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with the reason."""


def check_path_template(path: str | None, flag: str, placeholder: str) -> None:
    """ValueError naming `flag` when a checkpoint path has a placeholder other than
    `{placeholder}` (or a brace that is not one): found now, not at the first save."""
    if path is None:
        return
    try:
        path.format(**{placeholder: 1})
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"{flag} {path!r}: the only placeholder is {{{placeholder}}} ({type(e).__name__}: {e})"
        ) from None


def prune(written: list[str], keep: int) -> tuple[list[str], list[Path]]:
    """Deletes all but the `keep` newest of the checkpoints this run's lineage wrote
    (`written`, oldest first, the newest just saved whole); returns (the ones kept, the ones
    deleted). Files it did not write (another run's, an abandoned longer run's with higher step
    numbers) are never touched."""
    if keep < 1:
        raise ValueError(f"save_total_limit must be at least 1, got {keep}")
    kept, old = written[-keep:], [Path(p) for p in written[:-keep]]
    for p in old:
        # (A path written twice is kept once; a lineage read from a checkpoint names only
        # files that are checkpoints: a crafted one cannot have another file deleted.)
        if str(p) not in kept and is_checkpoint(p):
            p.unlink(missing_ok=True)
    return kept, old


def lineage(state: dict, resumed_from: str) -> list[str]:
    """The checkpoints a resumed run's lineage wrote, as its checkpoint lists them (one saved
    before lineages were kept: itself)."""
    written = state.get("checkpoints", [str(resumed_from)])
    if not isinstance(written, list) or not all(isinstance(p, str) for p in written):
        raise CheckpointError(f"checkpoint {resumed_from}: malformed list of checkpoints")
    return list(written)


def check_finite(weights: dict, path) -> None:
    """CheckpointError naming the first tensor of `weights` holding NaN or inf."""
    bad = nonfinite(weights)
    if bad:
        raise CheckpointError(f"checkpoint {path}: {bad[0]} holds NaN or inf")


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a regular file ending in a checkpoint's trailer."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - _TRAILER))
            return f.read().startswith(_MAGIC)
    except OSError:
        return False


def nonfinite(weights: dict) -> list[str]:
    """The names of the tensors in `weights` (a state dict) holding NaN or inf (none: [])."""
    tensors = [(n, t) for n, t in weights.items() if t.is_floating_point()]
    if not tensors:
        return []
    finite = torch.stack([t.detach().isfinite().all() for _, t in tensors])
    if finite.all():  # sync: once a checkpoint is saved or loaded, one flag for all tensors
        return []
    flags = finite.tolist()  # sync: only when some tensor is not finite, to name it
    return [name for (name, _), ok in zip(tensors, flags, strict=True) if not ok]


class _HashingWriter:
    """A file that hashes what passes through it; keeps the OSError of a failed write (torch
    reports it as its own error)."""

    def __init__(self, f):
        self.f, self.sha256, self.error = f, hashlib.sha256(), None

    def write(self, data) -> int:
        try:
            written = self.f.write(data)
        except OSError as e:
            self.error = e
            raise
        self.sha256.update(data)
        return written

    def flush(self) -> None:
        self.f.flush()


def _digest(t: torch.Tensor) -> str:
    """A tensor's contents' hash (one tensor copied at most: off a GPU, or a strided view)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # sync: a checkpoint reads the weights
    t = t.contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy()  # sync: none, on the host by now
    return hashlib.blake2b(data, digest_size=32).hexdigest()


# The subtrees whose tensors are weights that every loader copies out of (a model's state, the
# published and rollout copies): only there are equal tensors merged into one, since a loader
# that kept a merged tensor and updated it in place would update every place it stands for.
WEIGHTS = frozenset({"model", "published_weights", "rollout_weights", "reference", "agent"})


def _deduplicated(state, seen: dict | None = None, weights: bool = False):
    """`state` with every tensor under a WEIGHTS key whose dtype, shape and contents an earlier
    one has replaced by that earlier tensor, so `torch.save` writes it once (it writes a
    storage once however many tensors refer to it)."""
    seen = {} if seen is None else seen
    if isinstance(state, torch.Tensor):
        if not weights:
            return state
        if state.numel() * state.element_size() < _DEDUP_MIN_BYTES or state.is_sparse:
            return state
        key = (state.dtype, tuple(state.shape), state.device.type, _digest(state))
        return seen.setdefault(key, state)
    if isinstance(state, dict):
        return {k: _deduplicated(v, seen, weights or k in WEIGHTS) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_deduplicated(v, seen, weights) for v in state)
    return state


def save(path: str | Path, algorithm: str, args: dict, state: dict) -> None:
    """Writes atomically (nostall.files.replaced): a crash mid-write leaves the previous file
    intact. The state's tensors are read where they lie, not copied."""
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algorithm": algorithm,
        "args": dict(args),
        "state": _deduplicated(state),
    }
    path = Path(path)
    writer = None
    try:
        with files.replaced(path) as f:
            writer = _HashingWriter(f)
            torch.save(record, writer)
            f.write(_MAGIC + writer.sha256.hexdigest().encode() + b"\n")
    except BaseException as e:
        failed = e if isinstance(e, OSError) else getattr(writer, "error", None)
        if failed is None:
            raise
        raise OSError(
            failed.errno,
            f"cannot write checkpoint {path} ({failed.strerror}); the "
            "previous checkpoint there, if any, is intact",
        ) from e


def _file_digest(path: Path, length: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while length > 0:
            block = f.read(min(_READ_CHUNK, length))
            if not block:
                break
            sha.update(block)
            length -= len(block)
    return sha.hexdigest()


def load(path: str | Path, algorithm: str) -> tuple[dict, dict]:
    """(args, state) of a checkpoint written by `save` for `algorithm`; CheckpointError if it
    is missing, damaged, of another format or of another algorithm. The state's tensors are
    mapped from the file, not read into memory."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _TRAILER))
        trailer = f.read()
    if not (len(trailer) == _TRAILER and trailer.startswith(_MAGIC)):
        return _load_version_1(path, algorithm)
    if _file_digest(path, size - _TRAILER) != trailer[len(_MAGIC) : -1].decode("ascii", "replace"):
        raise CheckpointError(f"checkpoint {path} is damaged: its checksum does not match")
    try:
        record = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception as e:  # torch.load fails in many ways on a damaged file
        raise CheckpointError(
            f"checkpoint {path} is unreadable (damaged or not a "
            f"checkpoint): {type(e).__name__}: {e}"
        ) from None
    _check_record(record, path, algorithm)
    if not isinstance(record.get("args"), dict) or not isinstance(record.get("state"), dict):
        raise CheckpointError(f"checkpoint {path} is malformed")
    return record["args"], record["state"]


def _check_record(record, path: Path, algorithm: str) -> None:
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a nostall checkpoint")
    if record.get("format_version") not in (1, FORMAT_VERSION):
        raise CheckpointError(
            f"checkpoint {path} has format version {record.get('format_version')}; this "
            f"nostall reads versions 1 and {FORMAT_VERSION}"
        )
    if record.get("algorithm") != algorithm:
        raise CheckpointError(
            f"checkpoint {path} is from `{record.get('algorithm')}`, not `{algorithm}`"
        )


def _load_version_1(path: Path, algorithm: str) -> tuple[dict, dict]:
    """Version 1 (before streaming): the state serialised inside the record, hashed there."""
    try:
        record = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch.load fails in many ways on a damaged file
        raise CheckpointError(
            f"checkpoint {path} is unreadable (damaged or not a "
            f"checkpoint): {type(e).__name__}: {e}"
        ) from None
    _check_record(record, path, algorithm)
    payload = record.get("payload")
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
        raise CheckpointError(f"checkpoint {path} has no state")
    data = payload.numpy().tobytes()  # sync: none, a host tensor read from the file
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise CheckpointError(f"checkpoint {path} is damaged: its checksum does not match")
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:
        raise CheckpointError(f"checkpoint {path}: state unreadable: {e}") from None
    if not isinstance(record.get("args"), dict) or not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is malformed")
    return record["args"], state


# What a resume may change in every trainer's config: where it writes and keeps checkpoints,
# how it logs and watches, its backend and threads, when it stops. Each algorithm adds its own
# (the run's length, its device where the state allows).
RUN_RESUMABLE = frozenset(
    {
        "checkpoint",
        "checkpoint_every",
        "resume",
        "log_interval",
        "stop_when_solved",
        "watch_syncs",
        "backend",
        "torch_threads",
        "output_dir",
    }
)


def check_compatible(saved: dict, current: dict, may_differ: set[str]) -> None:
    """CheckpointError naming every field (outside `may_differ`) whose value differs."""
    fields = sorted(k for k in set(saved) | set(current) if k not in may_differ)
    conflicts = [k for k in fields if saved.get(k) != current.get(k)]
    if conflicts:
        detail = ", ".join(
            f"{k} (saved {saved.get(k)!r}, now {current.get(k)!r})" for k in conflicts
        )
        raise CheckpointError(f"cannot resume: arguments differ from the checkpoint's: {detail}")
