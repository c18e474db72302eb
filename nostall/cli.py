"""The `nostall` command.

    nostall train {ppo,appo} [--env-id ID] [--ARG VALUE ...]  train, with progress, logs, plots
    nostall train grpo [--model tiny|PATH] [--task copy] [--ARG VALUE ...]  GRPO on a causal LM
    nostall profile SCRIPT [options] [-- ARGS...]   run a script under SyncWatch, print a report
    nostall profile --diff BEFORE.json AFTER.json   what a change added or removed
    nostall trace TRACE.json [--json] [--plot PNG]  device idle breakdown of a torch.profiler
                                                    trace, and what the loop is bound by
    nostall eval RUN_DIR [--episodes N] [--sample] [--record OUT.gif]  evaluate a trained policy
    nostall bench                                   run every benchmark, side by side with peers

Exit codes: 0 success; 1 the profiled script failed; 2 bad usage (an unknown environment or
algorithm, a bad size, a missing script, an unreadable trace or checkpoint); 3 unintended syncs
found with --fail-on-sync, or a sync site added (--diff).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import itertools
import json
import re
import signal
import subprocess
import sys
import typing
from pathlib import Path

EXIT_SCRIPT_FAILED, EXIT_USAGE, EXIT_SYNC_FOUND = 1, 2, 3


ALGORITHMS = ("ppo", "appo", "grpo")


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of an Args dataclass (and its bases), CleanRL-style."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
            ):
                docs[node.target.id] = str(after.value.value)
    return docs


def _integer(text: str) -> int:
    """An int, also written as a whole float (`1e5`, `2.0e6`): step counts are written so."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


_PARSERS = {int: _integer, float: _number}


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        help_text = f"{docs.get(f.name, '')} (default: {f.default})"
        if hint is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
            continue
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        parser.add_argument(flag, type=_PARSERS.get(base, base), default=f.default,
                            help=help_text)  # fmt: skip


def _algorithm(name: str):
    import importlib

    return importlib.import_module(f"nostall.algos.{name}")


def _version() -> str:
    import torch

    import nostall
    from nostall.build_info import REBUILD, built_for

    if nostall.NATIVE_ERROR is not None:
        native = f"native library NOT loaded ({nostall.NATIVE_ERROR}); rebuild: {REBUILD}"
    else:
        cuda = "with CUDA kernels" if nostall.HAS_CUDA_KERNELS else "CPU kernels only"
        native = f"native library built for torch {built_for() or 'unknown'}, {cuda}"
    return f"nostall {nostall.__version__} (torch {torch.__version__}; {native})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nostall", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy (PPO, APPO) or a language model")
    algos = train.add_subparsers(dest="algorithm", required=True, metavar="{ppo,appo,grpo}")
    for name in ALGORITHMS:
        sub = algos.add_parser(name, help=_algorithm(name).__doc__.splitlines()[0])
        _add_dataclass_flags(sub, _algorithm(name).Args)
        if name != "grpo":
            sub.add_argument("--env", dest="env_id", help="alias of --env-id")
        sub.add_argument("--out", default=None, help="output folder (default: runs/ALGO-...)")
        sub.add_argument("--no-progress", action="store_true", help="no progress bar")

    commands.add_parser("bench", help="run every benchmark (installs the peers they measure)")

    evaluate = commands.add_parser(
        "eval", help="the return of a trained policy over N episodes; record one as a GIF"
    )
    evaluate.add_argument("run", help="a training run's directory (or its policy.pt)")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    evaluate.add_argument(
        "--sample", action="store_true", help="sample actions as in training (default: argmax)"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="environment seed (default: 0)")
    evaluate.add_argument("--record", default=None, help="write one episode to this .gif/.mp4")
    evaluate.add_argument("--json", action="store_true", help="print the summary as JSON")

    profile = commands.add_parser(
        "profile", help="run a script under SyncWatch and report its host-device syncs"
    )
    profile.add_argument("script", nargs="?", help="the Python script to run (as __main__)")
    profile.add_argument(
        "--diff",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help=f"compare two --json reports instead of running a script (exit {EXIT_SYNC_FOUND} if "
        "AFTER has a sync site BEFORE had not)",
    )
    profile.add_argument(
        "--only-user-code",
        action="store_true",
        help="report a sync inside an installed library at your line that called into it",
    )
    profile.add_argument("--json", action="store_true", help="print the report as JSON")
    profile.add_argument(
        "--fail-on-sync", action="store_true", help=f"exit {EXIT_SYNC_FOUND} on unintended syncs"
    )
    profile.add_argument(
        "--trace", metavar="PATH", help="also record a torch.profiler trace there and analyse it"
    )
    profile.add_argument(
        "--plot", metavar="PNG", help="with --trace: draw what the loop is bound by there"
    )
    profile.add_argument(
        "--all-tensors",
        action="store_true",
        help="treat every tensor as a device tensor (default: parameters, marked tensors, "
        "CUDA tensors and what is computed from them)",
    )

    trace = commands.add_parser(
        "trace", help="device idle breakdown of a torch.profiler trace, and what it is bound by"
    )
    trace.add_argument("trace", help="Chrome JSON trace (.json or .json.gz)")
    trace.add_argument("--json", action="store_true", help="print the analysis as JSON")
    trace.add_argument("--plot", metavar="PNG", help="draw what the loop is bound by there")
    trace.add_argument(
        "--kernel-delay-us",
        type=float,
        default=None,
        help="gaps below this between queued kernels count as kernel wait (default 0.03)",
    )
    return parser


def _profile(args: argparse.Namespace, script_args: list[str]) -> int:
    from nostall.profiler.runner import run_script
    from nostall.profiler.trace import TraceError

    if args.diff is not None:
        return _profile_diff(args)
    if args.script is None:
        print("nostall profile: a SCRIPT to run, or --diff BEFORE AFTER", file=sys.stderr)
        return EXIT_USAGE
    if args.plot and not args.trace:
        print("nostall profile: --plot needs --trace PATH (the plot is drawn from the trace)",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    # With --json, stdout carries the report alone: the script's own prints go to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with quiet:
            run = run_script(
                args.script,
                script_args,
                all_tensors=args.all_tensors,
                trace_path=args.trace,
                only_user_code=args.only_user_code,
            )
    except FileNotFoundError as e:
        print(f"nostall profile: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TraceError as e:
        print(f"nostall profile: {e}", file=sys.stderr)
        return EXIT_USAGE
    if run.error is not None:
        print(f"nostall profile: {args.script} raised an exception:", file=sys.stderr)
        print(run.error, file=sys.stderr, end="")
    report = run.report
    if args.plot and report.bound is not None:
        report.bound.plot(args.plot)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.table())
    if run.exit_code != 0:
        return run.exit_code if run.error is None else EXIT_SCRIPT_FAILED
    if args.fail_on_sync and report.unintended:
        return EXIT_SYNC_FOUND
    return 0


def _profile_diff(args: argparse.Namespace) -> int:
    from nostall.profiler import diff

    if args.script is not None:
        print("nostall profile: --diff compares two reports; give no SCRIPT", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = diff.diff(*(diff.load(path) for path in args.diff))
    except ValueError as e:
        print(f"nostall profile: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.table())
    return EXIT_SYNC_FOUND if result.added else 0


def _trace(args: argparse.Namespace) -> int:
    from nostall.profiler.bound import analyze_bound_by
    from nostall.profiler.report import format_idle
    from nostall.profiler.trace import (
        DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
        TraceError,
        analyze_trace,
    )

    delay = args.kernel_delay_us
    try:
        idle = analyze_trace(
            args.trace, DEFAULT_CONSECUTIVE_KERNEL_DELAY_US if delay is None else delay
        )
        bound = analyze_bound_by(args.trace)
    except TraceError as e:
        print(f"nostall trace: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot:
        bound.plot(args.plot)
    if args.json:
        print(json.dumps({**idle, "bound_by": bound.to_dict()}, indent=2, default=str))
    else:
        print(format_idle(idle) + "\n" + bound.table())
    return 0


def _train_grpo(args: argparse.Namespace) -> int:
    from nostall.algos import grpo
    from nostall.train.checkpoint import CheckpointError
    from nostall.train.grpo_setup import save_model
    from nostall.train.lm_output import LMProgress, write_outputs

    names = {f.name for f in dataclasses.fields(grpo.Args)}
    train_args = grpo.Args(**{k: v for k, v in vars(args).items() if k in names})
    try:
        setup = grpo.build(train_args)
    except ValueError as e:
        print(f"nostall train grpo: {e}", file=sys.stderr)
        return EXIT_USAGE
    source = Path(train_args.dataset).stem if train_args.dataset else train_args.task
    label = f"{Path(train_args.model).name}-{source}-{train_args.seed}"
    out_dir = Path(args.out or f"runs/grpo-{label}")
    progress = None if args.no_progress else LMProgress(train_args.steps, out_dir)
    try:
        result = grpo.train(train_args, log=progress, setup=setup)
    except CheckpointError as e:
        print(f"nostall train grpo: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if progress is not None:
            progress.close()
    print(write_outputs(result, out_dir))
    save_model(setup, out_dir / "model")
    print(
        f"  outputs in {out_dir}/ (report, reward_curve.png, timeline.png, tensorboard/, "
        "model/ for from_pretrained)"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    if args.algorithm == "grpo":
        return _train_grpo(args)
    from nostall.envs.gymnasium_adapter import make_env
    from nostall.training_output import Progress, write_outputs

    module = _algorithm(args.algorithm)
    names = {f.name for f in dataclasses.fields(module.Args)}
    train_args = module.Args(**{k: v for k, v in vars(args).items() if k in names})
    try:
        train_args.check()
        try:  # an unknown id (with the close matches), an unsupported space: now, not mid-run
            make_env(train_args.env_id, 1, backend=train_args.env_backend,
                     frame_stack=train_args.frame_stack).close()  # fmt: skip
        except ValueError as e:
            raise ValueError(f"--env-id: {e}") from e
        if train_args.resume:
            from nostall.algos.ppo import load_checkpoint

            # Unreadable or conflicting: a clear error now, not mid-run.
            load_checkpoint(train_args.resume, args.algorithm, train_args)
    except ValueError as e:
        print(f"nostall train: {e}", file=sys.stderr)
        return EXIT_USAGE
    steps = train_args.num_iterations * train_args.batch_size
    if steps != train_args.total_timesteps:
        print(f"nostall train: {train_args.total_timesteps} steps is not a whole number of "
              f"batches of {train_args.batch_size} (num_envs * num_steps): training {steps} "
              f"steps ({train_args.num_iterations} iterations)", file=sys.stderr)  # fmt: skip
    run_name = re.sub(r"[^A-Za-z0-9_.-]", "-", train_args.env_id)  # ALE/Pong-v5, module:Env
    out_dir = Path(args.out or f"runs/{args.algorithm}-{run_name}-{train_args.seed}")
    progress = None if args.no_progress else Progress(train_args.total_timesteps, out_dir)
    try:
        result = module.train(train_args, log=progress)
    except OSError as e:  # a checkpoint that cannot be written (a full disk, say)
        print(f"nostall train: {e}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    finally:
        if progress is not None:
            progress.close()
    print(write_outputs(result, args.algorithm, out_dir))
    print(
        f"  outputs in {out_dir}/ (report, policy.pt, learning_curve.png, timeline.png, "
        "tensorboard/)"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    from nostall.evaluate import evaluate, format_eval, record
    from nostall.policy import load_policy

    try:
        policy = load_policy(args.run, deterministic=not args.sample, seed=args.seed)
        summary = evaluate(policy, args.episodes, seed=args.seed)
        if args.record:
            frames = record(policy, args.record, seed=args.seed)
            summary["recording"] = {"path": args.record, "frames": frames}
    except (FileNotFoundError, ValueError) as e:
        print(f"nostall eval: {e}", file=sys.stderr)
        return EXIT_USAGE
    run = Path(args.run)
    if run.is_dir():
        (run / "eval.json").write_text(json.dumps(summary, indent=2))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_eval(summary))
        if args.record:
            print(f"  recorded {summary['recording']['frames']} frames to {args.record}")
    return 0


def _bench() -> int:
    root = Path(__file__).resolve().parent.parent
    scripts = sorted((root / "benchmarks").glob("*/bench_*.py"))
    if not scripts:
        print(
            "nostall bench: the benchmarks live in the source checkout; none found", file=sys.stderr
        )
        return EXIT_USAGE
    failed = 0
    for script in scripts:
        print(f"== {script.relative_to(root)}", flush=True)
        failed |= subprocess.run([sys.executable, str(script)], check=False).returncode
    return 1 if failed else 0


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after "--" belongs to the profiled script.
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if args.command == "train":
        # SIGTERM unwinds like Ctrl-C: `with runtime:` blocks stop and join their rollout side,
        # checkpoints already written stay intact.
        signal.signal(signal.SIGTERM, _terminate)
        try:
            return _train(args)
        except KeyboardInterrupt:
            print("nostall train: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
    if args.command == "bench":
        return _bench()
    if args.command == "eval":
        return _eval(args)
    if args.command == "profile":
        return _profile(args, script_args)
    return _trace(args)


if __name__ == "__main__":
    sys.exit(main())
