"""Peak memory of saving and loading a checkpoint against the state's size, and a GRPO
checkpoint's size against its model's.

    python -m benchmarks.checkpoints.memory [--mib 191] [--tensors 24]

Each measurement runs in a fresh process and reads its peak resident memory (ru_maxrss) before
and after: saving should add at most one tensor, loading (and copying into the model's own
tensors, as a resume does) at most the state plus one tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

MiB = 1 << 20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)


def measure(step: str, mib: int, tensors: int, path: str) -> dict:
    """In this process, one step: the peak memory `save` adds (writing the file), or the peak
    `load` and copying into a model's own tensors add (reading it)."""
    import torch

    from nostall.train import checkpoint

    each = mib * MiB // tensors // 4
    names = [f"w{i}" for i in range(tensors)]
    if step == "save":
        state = {"model": {name: torch.full((each,), float(i)) for i, name in enumerate(names)}}
        before = _peak_mib()
        checkpoint.save(path, "bench", {}, state)
        return {
            "state_mib": round(tensors * each * 4 / MiB, 1),
            "one_tensor_mib": round(each * 4 / MiB, 1),
            "save_peak_added_mib": round(_peak_mib() - before, 1),
            "file_mib": round(os.path.getsize(path) / MiB, 1),
        }
    # A resume's own tensors, resident already (as a model's are).
    into = {name: torch.empty(each).fill_(-1.0) for name in names}
    before = _peak_mib()
    _, loaded = checkpoint.load(path, "bench")
    for name, t in into.items():
        t.copy_(loaded["model"][name])
    added = _peak_mib() - before
    assert all(bool((into[name] == float(i)).all()) for i, name in enumerate(names))
    return {"load_peak_added_mib": round(added, 1)}


def grpo_sizes(out: str) -> dict:
    """A GRPO checkpoint of the built-in small model, against the model's own bytes."""
    from nostall.algos import grpo

    args = grpo.GRPOCommandConfig(
        model="small",
        steps=2,
        num_prompts=2,
        num_generations=2,
        watch_syncs=False,
        checkpoint=os.path.join(out, "g.pt"),
    )
    trainer = grpo.GRPOTrainer(args=args)
    trainer.train()
    # (Each tensor once: tied ones share a data pointer.)
    model = {
        p.data_ptr(): p.numel() * p.element_size() for p in trainer.model.state_dict().values()
    }
    model_bytes = sum(model.values())
    size = os.path.getsize(args.checkpoint)
    return {
        "model_mib": round(model_bytes / MiB, 2),
        "checkpoint_mib": round(size / MiB, 2),
        "checkpoint_over_model": round(size / model_bytes, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=191)
    parser.add_argument("--tensors", type=int, default=24)
    parser.add_argument("--child", choices=["save", "load", "grpo"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "c.pt")
        if args.child in ("save", "load"):
            print(json.dumps(measure(args.child, args.mib, args.tensors, args.path)))
            return
        if args.child == "grpo":
            print(json.dumps(grpo_sizes(out)))
            return
        results = {}
        for child in ("save", "load", "grpo"):
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.checkpoints.memory",
                    "--mib",
                    str(args.mib),
                    "--tensors",
                    str(args.tensors),
                    "--child",
                    child,
                    "--path",
                    path,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results[child] = json.loads(run.stdout.strip().splitlines()[-1])
    results["memory"] = {**results["save"], **results["load"]}
    m, g = results["memory"], results["grpo"]
    print(
        f"state {m['state_mib']} MiB in {args.tensors} tensors of {m['one_tensor_mib']} MiB; "
        f"file {m['file_mib']} MiB"
    )
    print(
        f"  save: peak memory +{m['save_peak_added_mib']} MiB "
        f"({m['save_peak_added_mib'] / m['state_mib']:.2f}x the state)"
    )
    print(
        f"  load and copy into the model: peak +{m['load_peak_added_mib']} MiB "
        f"({m['load_peak_added_mib'] / m['state_mib']:.2f}x the state)"
    )
    print(
        f"GRPO checkpoint (built-in small model, Adam): {g['checkpoint_mib']} MiB for a "
        f"{g['model_mib']} MiB model ({g['checkpoint_over_model']}x: the weights once, Adam's "
        "two moments, the rollout side's weights where they differ)"
    )


if __name__ == "__main__":
    main()
