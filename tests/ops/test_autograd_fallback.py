"""The Python autograd registrations (nostall/_autograd_fallback.py), which a torch that the
native autograd library was not built for gets instead of it: the op tests that differentiate
(gradients against the pure-PyTorch references, second derivatives where they exist and refusals
where they do not, opcheck's autograd checks) run again under them, in a subprocess."""

import os
import subprocess
import sys

import pytest

import nostall

DIFFERENTIATING_TESTS = [
    "tests/ops/test_advantages_registration.py",
    "tests/ops/test_losses_registration.py",
    "tests/ops/test_losses_reference.py",
    "tests/ops/test_token_entropy.py",
    "tests/ops/test_mlp.py",
    "tests/ops/test_sample_categorical.py",
    "tests/ops/test_ppo_loss.py",
]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def test_this_process_uses_the_native_autograd():
    """The fallback is for a mismatched torch only: a build's own torch gets the C++ kernels."""
    assert nostall.AUTOGRAD == "native"


def test_the_op_tests_pass_under_the_python_autograd():
    out = subprocess.run(
        # (Peak memory is not the autograd's business, and a sanitizer build inflates it.)
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "not peak_memory",
            *DIFFERENTIATING_TESTS,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, "NOSTALL_AUTOGRAD": "python"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout


@pytest.mark.parametrize("second_call", [False, True])
def test_an_unloadable_native_autograd_library_falls_back_with_a_notice(second_call):
    """As under a torch it was not built for: importing _C_autograd fails. The import warns once
    (naming both torch versions and the rebuild command), gradients still flow, and a second
    differentiable call works as the first."""
    code = f"""
import importlib.abc, sys, warnings
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "nostall._C_autograd":
            raise ImportError("undefined symbol: torch::autograd::_wrap_outputs (simulated)")
sys.meta_path.insert(0, Refuse())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nostall, torch
assert nostall.AUTOGRAD == "python", nostall.AUTOGRAD
notices = [str(w.message) for w in caught if "autograd" in str(w.message)]
assert len(notices) == 1, notices
print(notices[0])
logits = torch.randn(3, 4, 5, requires_grad=True)
tokens = torch.randint(0, 5, (3, 4))
for _ in range({2 if second_call else 1}):
    log_prob, _ = torch.ops.nostall.token_log_prob(logits, tokens)
    log_prob.sum().backward()
expected = torch.nn.functional.one_hot(tokens, 5) - logits.detach().softmax(-1)
torch.testing.assert_close(logits.grad, {2 if second_call else 1} * expected)
print("ok")
"""
    out = _python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
    notice = out.stdout.splitlines()[0]
    assert "do not load under torch" in notice and "simulated" in notice
    assert "Python autograd" in notice and "rebuild" in notice.lower()
