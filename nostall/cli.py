"""The `nostall` command.

    nostall profile SCRIPT [options] [-- ARGS...]   run a script under SyncWatch, print a report
    nostall trace TRACE.json [--json]               device idle breakdown of a torch.profiler trace

Exit codes: 0 success; 1 the profiled script failed; 2 bad usage, a missing script or an
unreadable trace; 3 unintended syncs found with --fail-on-sync.
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_SCRIPT_FAILED, EXIT_USAGE, EXIT_SYNC_FOUND = 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nostall", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    profile = commands.add_parser(
        "profile", help="run a script under SyncWatch and report its host-device syncs"
    )
    profile.add_argument("script", help="the Python script to run (as __main__)")
    profile.add_argument("--json", action="store_true", help="print the report as JSON")
    profile.add_argument(
        "--fail-on-sync", action="store_true", help=f"exit {EXIT_SYNC_FOUND} on unintended syncs"
    )
    profile.add_argument(
        "--trace", metavar="PATH", help="also record a torch.profiler trace there and analyse it"
    )
    profile.add_argument(
        "--all-tensors",
        action="store_true",
        help="treat every tensor as a device tensor (default: parameters, marked tensors, "
        "CUDA tensors and what is computed from them)",
    )

    trace = commands.add_parser("trace", help="device idle breakdown of a torch.profiler trace")
    trace.add_argument("trace", help="Chrome JSON trace (.json or .json.gz)")
    trace.add_argument("--json", action="store_true", help="print the analysis as JSON")
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

    try:
        run = run_script(
            args.script, script_args, all_tensors=args.all_tensors, trace_path=args.trace
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
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.table())
    if run.exit_code != 0:
        return run.exit_code if run.error is None else EXIT_SCRIPT_FAILED
    if args.fail_on_sync and report.unintended:
        return EXIT_SYNC_FOUND
    return 0


def _trace(args: argparse.Namespace) -> int:
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
    except TraceError as e:
        print(f"nostall trace: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(idle, indent=2, default=str) if args.json else format_idle(idle))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after "--" belongs to the profiled script.
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if args.command == "profile":
        return _profile(args, script_args)
    return _trace(args)


if __name__ == "__main__":
    sys.exit(main())
