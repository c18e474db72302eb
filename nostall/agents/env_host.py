"""A text environment in a process of its own (env_isolation="process"; env_process.py starts
it): run as a script, so the trainer's packages (torch, nostall) are not imported here, only
the environment's own module.

    python env_host.py '{"spec": "module:Class", "kwargs": {...}}'

Requests come one a line on stdin as JSON ({"op": "reset", "seed": 3}, {"op": "step",
"action": "..."}), answers go one a line as JSON ({"value": ...} or {"error": "Type: why"})
on the stdout the process was started with; what the environment prints goes to stderr. Only
JSON crosses back, so nothing the environment returns is unpickled in the trainer. The
process ends when stdin closes or its parent is gone (an orphan never outlives the run)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import types


def _plain(value):
    """A value JSON can carry: numpy scalars as numbers, anything else as its text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


def _load(spec: str):
    """The environment class or function: "module:Name" (imported as the trainer imports the
    user's code: installed modules first, then the working directory), or "path.py:Name" (a
    file loaded by itself: the built-in environments, without the nostall package)."""
    where, _, name = spec.partition(":")
    if where.endswith(".py"):
        _bare_package()
        loaded = importlib.util.spec_from_file_location("_nostall_env", where)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        return getattr(module, name)
    user_code = os.path.join(os.path.dirname(os.path.dirname(__file__)), "user_code.py")
    loaded = importlib.util.spec_from_file_location("_nostall_user_code", user_code)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module.import_named(spec, "--environment", "module:Class", "class or function")


def _bare_package() -> None:
    """nostall as a bare package (its modules importable, its __init__, which loads torch and
    the native library, not run): what a built-in environment imports of nostall is standard
    library code."""
    if "nostall" not in sys.modules:
        package = types.ModuleType("nostall")
        package.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        sys.modules["nostall"] = package


def _watch_parent(parent: int) -> None:
    """Ends this process once its parent is gone, even while the environment is stuck in a
    call (a thread of its own; the main thread may never come back)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)


def main() -> None:
    # The script's folder is not a place to import from (its files would shadow the user's
    # modules of the same names).
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # (the environment's prints: to stderr, never into the answers)
    sys.stdout = sys.stderr
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    settings = json.loads(sys.argv[1])
    try:
        env = _load(settings["spec"])(**settings.get("kwargs", {}))
        answers.write(json.dumps({"value": "ready"}) + "\n")
    except BaseException as error:  # (the user's constructor: whatever it raises)
        answers.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        return
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "reset":
                value = env.reset(seed=request.get("seed"), options=request.get("options"))
            else:
                value = env.step(request["action"])
            text = json.dumps({"value": value}, default=_plain)
        except BaseException as error:  # reported to the episode, which ends as failed
            text = json.dumps({"error": f"{type(error).__name__}: {error}"})
        answers.write(text + "\n")


if __name__ == "__main__":
    main()
