"""Multi-turn tool episodes: nostall against TRL 1.16's GRPOTrainer on the same script, the same
model and the same episodes, with each tool call taking 0, 50 or 200 ms (a sleep standing for an
API or a sandbox).

The model is benchmarks/lm/tool_caller.py's tiny Qwen2, fine-tuned to call `lookup` every turn,
so every episode is two rounds of tool calls and a third turn (TRL's
max_tool_calling_iterations=2): 4 prompts x 4 completions, 16 episodes and 32 calls a step. The
script is TRL's shape (GRPOConfig and GRPOTrainer with environment_factory) with only the import
changed; both at TRL's defaults (nostall: staleness 0, the algorithm held equal). Each side runs
in a fresh process. Per step (median after the first): its time, episodes a second, the seconds
its tool calls took, and the decoder's idle share: nostall's own figure (generation time with no
episode ready to decode); for TRL, whose loop runs a round's calls one after another while no
sequence decodes, the calls' seconds over the step's (a lower bound on its idle share of
generation).

    python -m benchmarks.lm.agents [--steps 3] [--latencies-ms 0,50,200] [--sides nostall,trl]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

LATENCY = float(os.environ.get("NOSTALL_BENCH_TOOL_LATENCY", "0"))


class SleepEnv:
    """One rollout's environment: `lookup` takes the benchmark's latency."""

    calls = 0
    seconds = 0.0

    def __init__(self):
        self.made = 0

    def reset(self, **kwargs):
        self.made = 0

    def lookup(self) -> str:  # (its schema, the prompt's, as the fine-tuning saw it)
        """Looks the answer up (a remote call).

        Returns:
            The answer.
        """
        began = time.perf_counter()
        time.sleep(LATENCY)
        SleepEnv.calls += 1
        SleepEnv.seconds += time.perf_counter() - began
        self.made += 1
        return "ok"

    def get_reward(self) -> float:
        return float(self.made)


def child(side: str, folder: str, steps: int, threads: int) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback

    if side == "trl":
        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
        from trl import GRPOConfig, GRPOTrainer
    else:
        from nostall import GRPOConfig, GRPOTrainer
    torch.set_num_threads(threads)
    stamps, tool_seconds, idle = [], [], []

    class Recorder(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())
            tool_seconds.append(SleepEnv.seconds)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "episodes/decoder_idle_fraction" in logs:
                idle.append(float(logs["episodes/decoder_idle_fraction"]))

    rows = [{"prompt": [{"role": "user", "content": "Look it up."}]}] * (4 * (steps + 1))
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            max_steps=steps + 1,
            per_device_train_batch_size=16,
            num_generations=4,
            max_completion_length=320,
            max_tool_calling_iterations=2,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
        )
        trainer = GRPOTrainer(
            model=folder,
            args=args,
            train_dataset=Dataset.from_list(rows),
            environment_factory=SleepEnv,
            callbacks=[Recorder()],
        )
        trainer.train()
        calls = [e["tools/call_frequency"] for e in trainer.state.log_history if "loss" in e]
    step_s = [b - a for a, b in itertools.pairwise(stamps)]
    tools_s = [b - a for a, b in itertools.pairwise(tool_seconds)]
    return {
        "step_s": step_s,
        "tool_s": tools_s,
        "calls_per_episode": calls[1:],
        "idle": idle[1:],
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latencies-ms", default="0,50,200")
    parser.add_argument("--sides", default="nostall,trl")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.steps, args.threads)))
        return
    from benchmarks.lm.tool_caller import build, calls_tools

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} threads")
    with tempfile.TemporaryDirectory() as folder:
        build(folder, steps=800)
        if not calls_tools(folder):
            raise SystemExit("the fine-tuned model does not call the tool: no episodes to race")
        print("tool-calling model built: its greedy turns call the tool")
        print(
            "| tool latency | side | step | episodes/s | tool seconds a step | calls/episode "
            "| decoder idle | peak |"
        )
        print("|---" * 8 + "|")
        for latency in args.latencies_ms.split(","):
            steps = {}
            for side in args.sides.split(","):
                run = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.lm.agents",
                        "--child",
                        side,
                        "--folder",
                        folder,
                        "--steps",
                        str(args.steps),
                        "--threads",
                        str(args.threads),
                    ],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "NOSTALL_BENCH_TOOL_LATENCY": str(float(latency) / 1e3)},
                )
                if run.returncode != 0:
                    print(run.stderr[-3000:])
                    raise SystemExit(f"{side} failed")
                r = json.loads(run.stdout.strip().splitlines()[-1])
                step = statistics.median(r["step_s"])
                tool = statistics.median(r["tool_s"])
                idle = statistics.median(r["idle"]) if r["idle"] else tool / step
                steps[side] = step
                calls = statistics.median(r["calls_per_episode"])
                print(
                    f"| {latency} ms | {side} | {step:.2f} s | {16 / step:.1f} | {tool:.2f} s | "
                    f"{calls:.2f} | {idle:.0%} | {r['peak_mib']:.0f} MiB |"
                )
            if "trl" in steps and "nostall" in steps:
                print(f"| {latency} ms | TRL / nostall | {steps['trl'] / steps['nostall']:.2f}x |")


if __name__ == "__main__":
    main()
