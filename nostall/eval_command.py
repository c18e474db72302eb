"""`nostall eval`: a trained PPO policy's return over episodes (and a recording of one), or,
with --dataset, a language model's mean reward and pass@k on a dataset (a GRPO run's folder, or
any model directory)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nostall import files
from nostall.user_code import working_directory_last

EXIT_USAGE = 2  # (the command's exit status for bad input, as nostall.cli's)


def _eval_lm(args: argparse.Namespace) -> int:
    """A language model's mean reward and pass@k on a dataset (console, and eval.json in a
    run's folder)."""
    from nostall.algos.grpo import GRPOCommandConfig
    from nostall.algos.grpo.evaluation import EvalSettings, evaluate_directory, format_summary

    working_directory_last()  # (the reward's module:function, as training finds it)
    try:
        ks = tuple(int(k) for k in args.k.split(","))
        config = GRPOCommandConfig(
            dataset=args.dataset,
            reward=args.reward,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
            watch_syncs=False,
        )
        settings = EvalSettings(args.num_generations, 64, args.pass_threshold, ks)
        summary = evaluate_directory(args.run, config, settings)
    except (FileNotFoundError, ValueError) as e:
        print(f"nostall eval: {e}", file=sys.stderr)
        return EXIT_USAGE
    if (Path(args.run) / "report.json").is_file():  # a run's folder: the summary beside its report
        files.write_text(Path(args.run) / "eval.json", json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    if args.dataset is not None:
        return _eval_lm(args)
    from nostall.algos.ppo.evaluate import evaluate, format_eval, record
    from nostall.algos.ppo.policy import load_policy

    try:
        policy = load_policy(
            args.run, deterministic=not args.sample, seed=args.seed, env_id=args.env
        )
        summary = evaluate(policy, args.episodes, seed=args.seed)
        if args.record:
            frames = record(policy, args.record, seed=args.seed)
            summary["recording"] = {"path": args.record, "frames": frames}
    except (FileNotFoundError, ValueError) as e:
        print(f"nostall eval: {e}", file=sys.stderr)
        return EXIT_USAGE
    run = Path(args.run)
    if run.is_dir():
        files.write_text(run / "eval.json", json.dumps(summary, indent=2))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_eval(summary))
        if args.record:
            print(f"  recorded {summary['recording']['frames']} frames to {args.record}")
    return 0
