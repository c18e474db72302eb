#!/usr/bin/env bash
# `make install-check`: nostall installed from this tree as a user installs it, outside the dev
# venv, in fresh venvs (build/install-check/):
#   1. a wheel built with pip's default build isolation (`pip wheel .`, the build that
#      `pip install .` runs) in a venv holding torch $TORCH_BUILT (the build backend pins the
#      isolated build's torch to it); installed there, it loads the native autograd kernels;
#   2. the same wheel installed into a venv holding torch $TORCH_OTHER, a torch it was not built
#      for: the stable-ABI kernels load, the autograd formulas come from Python with a one-line
#      notice;
#   3. where nvcc is present: a build from source against that CUDA torch with no GPU visible (the
#      default CUDA architectures): the CUDA kernels compile, link and register, and the native
#      autograd loads;
# each running a smoke subset from outside the source tree (every op forward and backward
# against its reference, environment steps against Gymnasium, a short PPO run).
# STEPS picks the parts ("wheel cuda" by default; "cuda" reuses the venv of part 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
built=${TORCH_BUILT:-2.13.0}
other=${TORCH_OTHER:-2.14.1}
steps=${STEPS:-wheel cuda}
work=$root/build/install-check
if [[ " $steps " == *" wheel "* ]]; then rm -rf "$work"; fi
mkdir -p "$work/dist" "$work/smoke"

# The tests, copied away from the source tree so `import nostall` finds the installed package.
rm -rf "$work/smoke/tests"
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

if [[ " $steps " == *" wheel "* ]]; then
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
fi

if [[ " $steps " == *" cuda "* ]] && command -v nvcc >/dev/null; then
  echo "== torch $other (CUDA), no GPU: build from source, CUDA kernels registered, smoke" >&2
  # A copy of the tree: pip builds in place, and this build must not touch the dev build's.
  rm -rf "$work/src"
  mkdir -p "$work/src"
  (cd "$root" && git ls-files -co --exclude-standard | grep -v '^build/' | tar -cf - -T -) |
    tar -xf - -C "$work/src"
  rm -f "$work"/src/nostall/*.so
  "$work/other/bin/pip" install -q "setuptools>=77" wheel ninja
  (cd "$work/src" && env -u TORCH_CUDA_ARCH_LIST "$work/other/bin/pip" install -q \
    --no-build-isolation --no-deps --force-reinstall .)
  (cd "$work/smoke" && "$work/other/bin/python" - <<'PY'
import torch
import nostall
assert torch.version.cuda and not torch.cuda.is_available(), "a CUDA torch with no GPU expected"
assert nostall.HAS_CUDA_KERNELS and nostall.AUTOGRAD == "native", (nostall.HAS_CUDA_KERNELS,
                                                                    nostall.AUTOGRAD)
# Host-side ops: the environment's control calls take host tensors (a CUDA step goes through
# env_step's stream-ordered kernel), and the CPU decoder ops have a GPU path in tensor ops.
HOST_ONLY = {"env_load", "env_send", "env_set_state", "decode_step", "prefill_prompts"}
names = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
               if n.startswith("nostall::"))
has = torch._C._dispatch_has_kernel_for_dispatch_key
missing = [n for n in names if n not in HOST_ONLY and not has(f"nostall::{n}", "CUDA")
           and not has(f"nostall::{n}", "CompositeExplicitAutograd")]
assert not missing, f"no CUDA kernel: {missing}"
print(f"torch {torch.__version__}: {len(names)} ops, every one but {sorted(HOST_ONLY)} with a "
      "CUDA kernel (or backend-independent)")
PY
  )
  (cd "$work/smoke" && "$work/other/bin/python" -m pytest -q -p no:cacheprovider "${smoke[@]}" |
    tail -2)
fi
echo "== install check passed" >&2
