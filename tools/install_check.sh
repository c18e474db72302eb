#!/usr/bin/env bash
# `make install-check`: nostall installed from this tree as a user installs it, outside the dev
# venv, in fresh venvs (build/install-check/):
#   1. a wheel built with pip's default build isolation (`pip wheel .`, the build that
#      `pip install .` runs) in a venv holding torch $TORCH_BUILT (the build backend pins the
#      isolated build's torch to it); installed there, it loads the native autograd kernels;
#   2. the same wheel installed into a venv holding torch $TORCH_OTHER, a torch it was not built
#      for: the stable-ABI kernels load, the autograd formulas come from Python with a one-line
#      notice;
# each running a smoke subset from outside the source tree (every op forward and backward
# against its reference, environment steps against Gymnasium, a short PPO run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
built=${TORCH_BUILT:-2.13.0}
other=${TORCH_OTHER:-2.14.1}
work=$root/build/install-check
rm -rf "$work"
mkdir -p "$work/dist" "$work/smoke"

# The tests, copied away from the source tree so `import nostall` finds the installed package.
cp -r "$root/tests" "$root/pyproject.toml" "$work/smoke/"
smoke=(tests/ops/test_advantages_registration.py tests/ops/test_losses_registration.py
       tests/ops/test_mlp.py tests/ops/test_sample_categorical.py tests/ops/test_ppo_loss.py
       tests/envs/test_gymnasium_oracle.py)

check() {  # venv, expected autograd
  local venv=$1 autograd=$2
  (cd "$work/smoke" && "$venv/bin/python" - "$autograd" <<'PY'
import sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nostall, torch
assert "site-packages" in nostall.__file__, nostall.__file__
assert hasattr(torch.ops.nostall, "gae"), "torch.ops.nostall.* missing after import"
assert nostall.AUTOGRAD == sys.argv[1], (nostall.AUTOGRAD, sys.argv[1])
notices = [str(w.message) for w in caught if "autograd" in str(w.message)]
assert len(notices) == (sys.argv[1] == "python"), notices
print(f"torch {torch.__version__}: nostall {nostall.__version__} from {nostall.__file__}, "
      f"autograd {nostall.AUTOGRAD}", *notices, sep="\n  ")
PY
  )
  (cd "$work/smoke" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "${smoke[@]}" |
    tail -3)
  (cd "$work" && "$venv/bin/nostall" train ppo --env CartPole-v1 --total-timesteps 4096 \
    --out "$work/run-$(basename "$venv")" | tail -3)
}

echo "== a venv with torch $built: pip wheel . (build isolation), install, smoke" >&2
"$python" -m venv "$work/built"
"$work/built/bin/pip" install -q "torch==$built" pytest hypothesis
(cd "$root" && "$work/built/bin/pip" wheel -q --no-deps -w "$work/dist" .)
wheel=$(ls "$work"/dist/nostall-*.whl)
echo "built $(basename "$wheel")" >&2
"$work/built/bin/pip" install -q "$wheel"
check "$work/built" native

echo "== a venv with torch $other: the same wheel, smoke" >&2
"$python" -m venv "$work/other"
"$work/other/bin/pip" install -q "torch==$other" pytest hypothesis
"$work/other/bin/pip" install -q "$wheel"
check "$work/other" python
echo "== install check passed" >&2
