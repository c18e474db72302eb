"""TRL-shaped scripts run under both libraries: the script's text with `{lib}` in its import
line, run as a user runs it (a fresh namespace, OUT and MODEL given), under nostall and, where
TRL is installed, under TRL."""

import importlib.util
import textwrap

import pytest

HAS_TRL = importlib.util.find_spec("trl") is not None
# pytest.mark.parametrize("lib", LIBS): nostall always, TRL where installed
LIBS = ["nostall", pytest.param("trl", marks=pytest.mark.skipif(not HAS_TRL, reason="TRL"))]


def run_script(script: str, lib: str, model_dir, out) -> tuple[object, list[dict]]:
    """The trainer's state after running `script` under `lib`, and its log lines of a step."""
    namespace = {"OUT": str(out), "MODEL": str(model_dir)}
    text = textwrap.dedent(script).format(lib=lib)
    exec(compile(text, f"<script under {lib}>", "exec"), namespace)
    state = namespace["trainer"].state
    return state, [entry for entry in state.log_history if "loss" in entry]
