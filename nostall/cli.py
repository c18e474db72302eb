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
import contextlib
import importlib
import json
import signal
import subprocess
import sys
from pathlib import Path

from nostall.config_flags import add_flags, config_from
from nostall.user_code import working_directory_last

EXIT_SCRIPT_FAILED, EXIT_USAGE, EXIT_SYNC_FOUND = 1, 2, 3


# Each algorithm's package, config and trainer: imported only when `nostall train` runs, so
# the other commands work when the native library cannot load.
TRAINERS = {
    "ppo": ("nostall.algos.ppo", "PPOConfig", "PPOTrainer", "PPO with GAE on any environment"),
    "appo": (
        "nostall.algos.appo",
        "APPOConfig",
        "APPOTrainer",
        "asynchronous PPO with V-trace, its rollout overlapped with training",
    ),
    "grpo": (
        "nostall.algos.grpo",
        "GRPOCommandConfig",
        "GRPOTrainer",
        "GRPO for a causal language model, its generation overlapped with training",
    ),
}


def _trainer(name: str) -> tuple[type, type]:
    """(config class, trainer class) of an algorithm."""
    module, config, trainer, _ = TRAINERS[name]
    package = importlib.import_module(module)
    return getattr(package, config), getattr(package, trainer)


def _version() -> str:
    import torch

    import nostall
    from nostall.build_info import REBUILD, built_for, cuda_skipped

    if nostall.NATIVE_ERROR is not None:
        native = f"native library NOT loaded ({nostall.NATIVE_ERROR}); rebuild: {REBUILD}"
    else:
        cuda = "with CUDA kernels" if nostall.HAS_CUDA_KERNELS else "CPU kernels only"
        if not nostall.HAS_CUDA_KERNELS and torch.version.cuda and cuda_skipped():
            cuda += f" ({cuda_skipped()})"  # (a CUDA torch: why not, and how to get them)
        native = f"native library built for torch {built_for() or 'unknown'}, {cuda}"
    return f"nostall {nostall.__version__} (torch {torch.__version__}; {native})"


def _parser(train_flags: bool = True) -> argparse.ArgumentParser:
    """The command's parser; `train_flags` False leaves the trainers' flags out (and so their
    imports: the native library)."""
    parser = argparse.ArgumentParser(prog="nostall", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy (PPO, APPO) or a language model")
    algos = train.add_subparsers(dest="algorithm", required=True, metavar="{ppo,appo,grpo}")
    for name, (*_, summary) in TRAINERS.items():
        sub = algos.add_parser(name, help=summary, description=summary)
        if not train_flags:
            continue
        add_flags(sub, _trainer(name)[0])
        if name != "grpo":
            sub.add_argument("--env", dest="env_id", help="alias of --env-id")
        sub.add_argument(
            "--out", dest="output_dir", default=argparse.SUPPRESS, help="alias of --output-dir"
        )
        sub.add_argument(
            "--overwrite",
            action="store_true",
            help="write into an output folder that holds a previous run (refused "
            "otherwise, unless resuming)",
        )
        sub.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress bar (the TensorBoard logs are written all the same)",
        )

    commands.add_parser("bench", help="run every benchmark (installs the peers they measure)")

    evaluate = commands.add_parser(
        "eval",
        help="the return of a trained policy over N episodes (record one as a GIF); with "
        "--dataset, a language model's mean reward and pass@k",
    )
    evaluate.add_argument("run", help="a training run's directory (or its policy.pt)")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    evaluate.add_argument(
        "--sample", action="store_true", help="sample actions as in training (default: argmax)"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="environment seed (default: 0)")
    evaluate.add_argument(
        "--env",
        default=None,
        help="the environment to act in (default: the one the policy file "
        "names, if registered; a module:Class only from here)",
    )
    evaluate.add_argument("--record", default=None, help="write one episode to this .gif/.mp4")
    evaluate.add_argument("--json", action="store_true", help="print the summary as JSON")
    lm = evaluate.add_argument_group(
        "a language model (a GRPO run's folder or a model directory, with --dataset)"
    )
    lm.add_argument("--dataset", default=None, help="prompts: a JSONL file or a datasets folder")
    lm.add_argument(
        "--reward", default=None, help="reward functions, module:function, comma-separated"
    )
    lm.add_argument("--num-generations", type=int, default=8, help="completions a prompt (8)")
    lm.add_argument("--k", default="1", help="the k of pass@k, comma-separated (default: 1)")
    lm.add_argument(
        "--pass-threshold", type=float, default=1.0, help="a reward that counts as a solve (1)"
    )
    lm.add_argument("--max-new-tokens", type=int, default=None, help="completion length limit")
    lm.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1)")

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
        print(
            "nostall profile: --plot needs --trace PATH (the plot is drawn from the trace)",
            file=sys.stderr,
        )
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


def _train(args: argparse.Namespace) -> int:
    from nostall.train.checkpoint import CheckpointError
    from nostall.train.outputs import Progress, previous_run
    from nostall.train.reporters import requested

    # "module:function" (a reward, an environment class) is found in the working directory
    # too, after every installed module (nostall.user_code).
    working_directory_last()
    config_class, trainer_class = _trainer(args.algorithm)
    try:
        config = config_from(args, config_class)
    except ValueError as e:  # flags that contradict each other (two names of one setting)
        print(f"nostall train {args.algorithm}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if config.output_dir is None:  # the first of runs/NAME, runs/NAME-2, ... free of a run
        config.output_dir = f"runs/{args.algorithm}-{config.folder_name}"
        try:
            config.check()  # (the name is made of settings: a bad one is named, not a path)
        except ValueError as e:
            print(f"nostall train {args.algorithm}: {e}", file=sys.stderr)
            return EXIT_USAGE
        if not (config.resume or args.overwrite):
            config.output_dir = _free_folder(config.output_dir, previous_run)
    earlier = previous_run(config.output_dir)
    if earlier and not (config.resume or args.overwrite):
        print(
            f"nostall train {args.algorithm}: output folder {config.output_dir} holds a "
            f"previous run ({', '.join(earlier)}); give another --out, --resume one of its "
            "checkpoints, or --overwrite to replace it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        trainer = trainer_class(args=config)  # every argument checked, the run built
    except ValueError as e:  # a bad argument, an unknown environment, a bad checkpoint
        print(f"nostall train {args.algorithm}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if config.rounding_note:
        print(f"nostall train {args.algorithm}: {config.rounding_note}", file=sys.stderr)
    out_dir = Path(config.output_dir)
    total, unit, first = trainer.progress_span()
    # (GRPO's --report-to none: no TensorBoard logs; the other reporters are the trainer's)
    tensorboard = requested(getattr(config, "report_to", "tensorboard"))
    progress = Progress(
        total,
        out_dir,
        unit,
        first,
        bar=not args.no_progress,
        tensorboard="tensorboard" in tensorboard,
    )
    try:
        trainer.train(log=progress)
    except CheckpointError as e:
        print(f"nostall train {args.algorithm}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, FloatingPointError) as e:  # a checkpoint not written: a full disk, NaN
        print(f"nostall train {args.algorithm}: {e}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    finally:
        progress.close()
    print(trainer.report)
    print(f"  outputs in {out_dir}/ ({', '.join(trainer.outputs)})")
    return 0


def _free_folder(folder: str, previous_run) -> str:
    """`folder`, or the first `folder-N` (N = 2, 3, ...) that holds no earlier run; says which
    when it is not `folder`."""
    candidate, n = folder, 1
    while previous_run(candidate):
        n += 1
        candidate = f"{folder}-{n}"
    if candidate != folder:
        print(
            f"nostall: {folder} holds a previous run; this one writes to {candidate}",
            file=sys.stderr,
        )
    return candidate


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
    training = bool(argv) and argv[0] == "train"
    try:
        parser = _parser(train_flags=training)
    except ImportError as e:  # the trainers need the native library; the other commands do not
        print(f"nostall train: {e}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    args = parser.parse_args(argv)
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
        from nostall.eval_command import run_eval

        return run_eval(args)
    if args.command == "profile":
        return _profile(args, script_args)
    return _trace(args)


if __name__ == "__main__":
    sys.exit(main())
