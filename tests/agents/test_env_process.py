"""Text environments in processes of their own (env_isolation="process"): each instance runs
in a host process that imports neither torch nor nostall, answers in JSON (nothing it returns
is unpickled in the trainer), is killed when a call passes its timeout or its process crashes
(and replaced at its next use), and never outlives the trainer, even one killed outright."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from nostall.agents.env_process import EnvProcessPool, HostedEnv
from nostall.agents.text_env import EnvError, check_step

WHERE = HostedEnv("tests.agents.text_envs:WhereAmI")


def _ended(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie no one has reaped yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


def _wait_ended(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s  # (a bound for a slow machine, not a timing check)
    while time.monotonic() < deadline:
        if _ended(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool():
    made = EnvProcessPool(WHERE, size=2, timeout_s=1.0)
    yield made
    made.close()


def test_an_environment_runs_in_a_process_of_its_own_and_answers_gymnasiums_tuples(pool):
    env = pool.make_env()
    observation, info = env.reset(seed=3)
    assert observation == "seed 3"  # (its print to stdout went to stderr, not the answer)
    assert info["pid"] != os.getpid()
    step = env.step("b")
    assert step == ("b", 1.0, False, False, {"pid": info["pid"]})
    assert check_step(step)[0] == "b"
    # The next environment handed out is another process's; the first keeps its process.
    other = pool.make_env()
    assert other.reset(seed=1)[1]["pid"] not in (info["pid"], os.getpid())
    assert env.reset(seed=4)[1]["pid"] == info["pid"]


def test_a_call_past_its_timeout_kills_the_process_and_the_next_use_starts_another(pool):
    env = pool.make_env()
    pid = env.reset(seed=0)[1]["pid"]
    with pytest.raises(TimeoutError, match=r"within tool_timeout 1.0 s \(its process was killed"):
        env.step("hang")
    assert _wait_ended(pid)
    assert env.reset(seed=0)[1]["pid"] != pid


def test_a_crashed_process_is_named_and_replaced(pool):
    env = pool.make_env()
    pid = env.reset(seed=0)[1]["pid"]
    with pytest.raises(EnvError, match=r"step\(\): the environment's process ended \(exit code 7"):
        env.step("exit")
    assert env.reset(seed=0)[1]["pid"] != pid


def test_an_answer_json_cannot_carry_arrives_as_text_and_fails_the_step_check(pool):
    env = pool.make_env()
    env.reset(seed=0)
    answer = env.step("object")
    assert isinstance(answer, str) and "object" in answer
    with pytest.raises(EnvError, match=r"not \(observation, reward"):
        check_step(answer)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.agents.text_envs:BrokenInit", "RuntimeError: no licence for the simulator"),
        ("no_such_module_here:Env", "cannot import 'no_such_module_here'"),
        ("tests.agents.text_envs:Missing", "has no class or function 'Missing'"),
    ],
)
def test_an_environment_that_cannot_be_made_is_named(spec, message):
    pool = EnvProcessPool(HostedEnv(spec), size=1, timeout_s=30.0)
    try:
        with pytest.raises(EnvError, match=message):
            pool.make_env().reset(seed=0)
    finally:
        pool.close()


def test_closing_the_pool_ends_its_processes():
    pool = EnvProcessPool(WHERE, size=2, timeout_s=30.0)
    pids = [pool.make_env().reset(seed=s)[1]["pid"] for s in range(2)]
    pool.close()
    assert all(_wait_ended(pid) for pid in pids)


def test_a_trainer_killed_outright_leaves_no_environment_process_behind():
    """The trainer's process ends without running any cleanup (os._exit, as a SIGKILL would):
    its environment process, even one stuck in a call, ends by itself."""
    script = textwrap.dedent(
        """
        import os, threading
        from nostall.agents.env_process import EnvProcessPool, HostedEnv
        pool = EnvProcessPool(HostedEnv("tests.agents.text_envs:WhereAmI"), 1, None)
        env = pool.make_env()
        print(env.reset(seed=0)[1]["pid"], flush=True)
        threading.Thread(target=env.step, args=("hang",), daemon=True).start()
        threading.Event().wait(1.0)
        os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    host = int(done.stdout.split()[0])
    assert _wait_ended(host)


def test_a_built_in_environment_is_hosted_without_torch():
    """The built-in environments load by file in their process, nostall a bare package there:
    the calculator's word problems come without torch (a host starts in a fraction of a
    second, not the seconds torch takes to import)."""
    from nostall.agents import calculator, env_host

    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("host", {env_host.__file__!r})
        host = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(host)
        env = host._load({calculator.__file__ + ":Calculator"!r})(max_turns=2)
        print(env.reset(seed=7)[0], "torch" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split()[-1] == "False" and "left=" in done.stdout


def test_the_calculator_in_its_own_process_answers_as_in_this_one():
    from nostall.agents.calculator import Calculator
    from nostall.agents.tasks import HOSTED_TASKS

    pool = EnvProcessPool(HOSTED_TASKS["calc"](3), size=1, timeout_s=60.0)
    try:
        hosted, local = pool.make_env(), Calculator(max_turns=3)
        assert hosted.reset(seed=11) == local.reset(seed=11)
        for action in ("2+3*4", "?", "14"):
            assert hosted.step(action) == local.step(action)
    finally:
        pool.close()
