"""The package as a user meets it: `import nostall` registers the ops, `nostall --version`
says what was built, and without the native library the profiler still works while the first
op names the reason and the rebuild command."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_import_registers_the_ops():
    result = _python("""
        import torch, nostall
        print(torch.ops.nostall.gae, torch.ops.nostall.sample_tokens, nostall.NATIVE_ERROR)
    """)
    assert result.returncode == 0, result.stderr
    assert "None" in result.stdout


def test_version_names_torch_and_the_native_build():
    result = subprocess.run(
        [sys.executable, "-m", "nostall.cli", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0
    assert "nostall 0.1.0" in result.stdout and "built for torch" in result.stdout


def test_without_the_native_library_the_profiler_works_and_ops_say_why():
    # A finder that makes the native modules unimportable, as a failed or mismatched build.
    result = _python("""
        import sys, importlib.abc
        class Broken(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name in ("nostall._C", "nostall._C_autograd"):
                    raise ImportError("undefined symbol: torch::autograd::_wrap_outputs")
        sys.meta_path.insert(0, Broken())
        import torch, nostall
        from nostall.profiler import SyncWatch
        with SyncWatch() as watch:
            torch.ones(3).sum()
        print("profiler ok", watch.report().unintended_count)
        try:
            import nostall.ops
        except ImportError as e:
            print("ops:", e)
    """)
    assert result.returncode == 0, result.stderr
    assert "profiler ok 0" in result.stdout
    assert "cannot load under torch" in result.stdout and "Rebuild it" in result.stdout
    assert "_wrap_outputs" in result.stdout


def test_without_the_native_library_the_command_still_profiles_and_says_its_version(tmp_path):
    """The command imports a trainer only to train: `nostall --version` and `nostall profile`
    work when the native library cannot load, and `nostall train` says why it cannot."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\nx = torch.ones(3)\nfor _ in range(3):\n    (x * 2).sum()\n")
    result = _python(f"""
        import sys, importlib.abc
        class Broken(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name in ("nostall._C", "nostall._C_autograd"):
                    raise ImportError("undefined symbol: torch::autograd::_wrap_outputs")
        sys.meta_path.insert(0, Broken())
        from nostall import cli
        try:
            cli.main(["--version"])
        except SystemExit as e:
            print("version exit", e.code)
        print("profile exit", cli.main(["profile", {str(script)!r}]))
        print("train exit", cli.main(["train", "ppo", "--total-timesteps", "1024"]))
    """)
    assert result.returncode == 0, result.stderr
    assert "version exit 0" in result.stdout and "native library NOT loaded" in result.stdout
    assert "profile exit 0" in result.stdout
    assert "train exit 1" in result.stdout
    assert "nostall train: nostall's native library cannot load" in result.stderr
