"""One checkpoint format for every trainer and backend.

A checkpoint file holds a header (format name and version, the algorithm, the run's
arguments) and the trainer's state serialised separately with a SHA-256 checksum over it, so a
damaged file (truncated, bit-flipped, random bytes) is refused with a clear message instead of
resuming from garbage. Both layers load with `torch.load(weights_only=True)`: a checkpoint
from elsewhere cannot run code. A resume whose arguments conflict with the saved ones is
refused, naming the fields.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path

import torch

FORMAT = "nostall-checkpoint"
FORMAT_VERSION = 1


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
        raise ValueError(f"{flag} {path!r}: the only placeholder is {{{placeholder}}} "
                         f"({type(e).__name__}: {e})") from None  # fmt: skip


def prune(template: str, keep: int, placeholder: str = "step") -> list[Path]:
    """Deletes all but the `keep` newest checkpoints (by the number in `{placeholder}`) that
    the path template names, a resumed run's earlier ones included; returns what it deleted."""
    path = Path(template)
    parts = re.split(r"\{" + placeholder + r"(?::[^}]*)?\}", path.name)  # ({step:06d} too)
    if len(parts) != 2:
        raise ValueError(f"{template!r}: pruning needs {{{placeholder}}} once in the file name")
    before, after = (part.replace("{{", "{").replace("}}", "}") for part in parts)
    pattern = re.compile(re.escape(before) + r"(\d+)" + re.escape(after) + "$")
    found = sorted((int(m.group(1)), p) for p in path.parent.glob("*")
                   if (m := pattern.match(p.name)) and p.is_file())  # fmt: skip
    old = [p for _, p in found[: max(0, len(found) - keep)]]
    for p in old:
        p.unlink(missing_ok=True)
    return old


def save(path: str | Path, algorithm: str, args: dict, state: dict) -> None:
    """Writes atomically: a crash mid-write leaves the previous file intact."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algorithm": algorithm,
        "args": dict(args),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    outer = io.BytesIO()
    torch.save(record, outer)  # in memory: a write error below is a plain OSError
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(outer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write checkpoint {path} ({e.strerror}); the previous "
                      "checkpoint there, if any, is intact") from e  # fmt: skip
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: str | Path, algorithm: str) -> tuple[dict, dict]:
    """(args, state) of a checkpoint written by `save` for `algorithm`; CheckpointError if it
    is missing, damaged, of another format or of another algorithm."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        record = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch.load fails in many ways on a damaged file
        raise CheckpointError(f"checkpoint {path} is unreadable (damaged or not a "
                              f"checkpoint): {type(e).__name__}: {e}") from None  # fmt: skip
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a nostall checkpoint")
    if record.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {record.get('format_version')}; this "
            f"nostall reads version {FORMAT_VERSION}"
        )
    if record.get("algorithm") != algorithm:
        raise CheckpointError(
            f"checkpoint {path} is from `{record.get('algorithm')}`, not `{algorithm}`"
        )
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


def check_compatible(saved: dict, current: dict, may_differ: set[str]) -> None:
    """CheckpointError naming every field (outside `may_differ`) whose value differs."""
    fields = sorted(k for k in set(saved) | set(current) if k not in may_differ)
    conflicts = [k for k in fields if saved.get(k) != current.get(k)]
    if conflicts:
        detail = ", ".join(f"{k} (saved {saved.get(k)!r}, now {current.get(k)!r})"
                           for k in conflicts)  # fmt: skip
        raise CheckpointError(f"cannot resume: arguments differ from the checkpoint's: {detail}")
