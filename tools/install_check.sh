#!/usr/bin/env bash
# `make install-check`: nostall installed from this tree as a user installs it, outside the dev
# venv, in fresh venvs (build/install-check/), each build from a copy of the tracked files (what
# a clean checkout holds; the working tree is never built in):
#   1, 2. `python -m build`: an sdist, and a wheel built from that sdist with build isolation
#      (so the sdist carries all a build needs; the build backend pins the isolated build's
#      torch to $TORCH_BUILT, as it does for `pip install .`), installed in a venv holding torch
#      $TORCH_BUILT: it loads the native autograd;
#   3. that wheel installed into a venv holding torch $TORCH_OTHER, a torch it was not built
#      for: the stable-ABI kernels load, the autograd formulas come from Python with a one-line
#      notice;
#   4. where nvcc is present: a build from source against that CUDA torch with no GPU visible (the
#      default CUDA architectures): the CUDA kernels compile, link and register, the native
#      autograd loads, and the suites that call every native kernel pass under that torch (the
#      trainers' suites, Python over the same kernels, ran under the pinned torch in `make test`);
# 1-4 run a smoke subset from outside the source tree (every op forward and backward against
# its reference, environment steps against Gymnasium, a short PPO run).
#   5. that CUDA torch with no CUDA toolkit visible (a stock Linux machine): the in-place build
#      `make run` does makes the CPU kernels and says why, `nostall --version` says so, the smoke
#      suites pass, and then `make run` and `make test` themselves, in that venv;
# STEPS picks the parts ("wheel nocuda cuda" by default: 1-3, 5 and 4; "nocuda" and "cuda"
# reuse the venv of part 3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
built=${TORCH_BUILT:-2.13.0}
other=${TORCH_OTHER:-2.14.1}
steps=${STEPS:-wheel nocuda cuda}
work=$root/build/install-check
if [[ " $steps " == *" wheel "* ]]; then rm -rf "$work"; fi
mkdir -p "$work/dist" "$work/smoke"

# The tests, copied away from the source tree so `import nostall` finds the installed package.
rm -rf "$work/smoke/tests"
smoke=(tests/ops/test_advantages_registration.py tests/ops/test_losses_registration.py
       tests/ops/test_mlp.py tests/ops/test_sample_categorical.py tests/ops/test_ppo_loss.py
       tests/envs/test_gymnasium_oracle.py)

# The tree as a clean checkout holds it (tracked and untracked-but-not-ignored files, no build
# outputs), taken once at the start so every part builds the same sources.
rm -rf "$work/snapshot"
mkdir -p "$work/snapshot"
(cd "$root" && git ls-files -co --exclude-standard | grep -v '^build/' | tar -cf - -T -) |
  tar -xf - -C "$work/snapshot"
rm -f "$work"/snapshot/nostall/*.so

copy_tree() {  # destination
  rm -rf "$1"
  cp -a "$work/snapshot" "$1"
}

cp -r "$work/snapshot/tests" "$work/snapshot/pyproject.toml" "$work/smoke/"

# The suites that call the native code: every op kernel and its autograd formula, the
# environments' and the decoder ops' suites. Everything else (trainers, runtime, profiler,
# command line, fault injection) is Python over those same calls. Part 4 runs them under the
# CUDA torch with its CUDA kernels built, in a source copy (they read files of the tree), with
# what they import beyond the smoke set; part 5 runs the whole of `make test` under that torch.
native_suites=(tests/ops tests/envs/test_env_ops.py tests/envs/test_env_errors.py
               tests/lm/test_decoder_train.py tests/lm/test_generate_completions.py
               tests/lm/test_sample_tokens.py tests/lm/test_generation.py tests/test_package.py)
suite_deps() {  # venv
  "$1/bin/pip" install -q pygame "gymnasium==1.4.0" "torchrl==0.14.1" \
    "transformers==5.23.0" "tokenizers==0.23.3"
}

check() {  # venv, expected autograd, a name for the PPO run's folder
  local venv=$1 autograd=$2 name=$3
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
    --out "$work/run-$name" | tail -3)
}

if [[ " $steps " == *" wheel "* ]]; then
  "$python" -m venv "$work/built"
  "$work/built/bin/pip" install -q "torch==$built" pytest hypothesis build

  echo "== python -m build: an sdist, and a wheel built from it (build isolation)" >&2
  copy_tree "$work/src-build"
  (cd "$work/src-build" && "$work/built/bin/python" -m build -o "$work/dist" . >/dev/null)
  sdist=$(ls "$work"/dist/nostall-*.tar.gz)
  wheel=$(ls "$work"/dist/nostall-*.whl)
  echo "built $(basename "$sdist") and $(basename "$wheel")" >&2
  # The sdist must hold every source a build needs: it is the only input of the wheel above.
  tar -tzf "$sdist" >"$work/sdist-files"
  grep -q "tools/build_backend/nostall_build.py" "$work/sdist-files"
  grep -q "csrc/registration.cpp" "$work/sdist-files"

  # (pip's own `pip install .` builds the same wheel the same way: PEP 517, isolated, the
  # backend pinning the isolated torch; its build is not repeated here.)
  echo "== a venv with torch $built: the wheel, smoke" >&2
  "$work/built/bin/pip" install -q "$wheel"
  check "$work/built" native install

  echo "== a venv with torch $other: the wheel, smoke" >&2
  "$python" -m venv "$work/other"
  "$work/other/bin/pip" install -q "torch==$other" pytest hypothesis
  "$work/other/bin/pip" install -q "$wheel"
  check "$work/other" python wheel
fi

if [[ " $steps " == *" nocuda "* ]]; then
  # A stock Linux machine: the CUDA torch pip installs, no CUDA toolkit. The build `make run`
  # and `make test` do (build_ext in place) makes the CPU kernels and says why not the CUDA
  # ones, `nostall --version` says so with what to do, and the smoke suites, `make run` and
  # `make test` pass under that torch. The toolkit is hidden: CUDA_HOME an empty folder, no
  # nvcc on the PATH.
  echo "== torch $other (CUDA), no CUDA toolkit visible: the in-place build" >&2
  copy_tree "$work/src-nocuda"
  mkdir -p "$work/no-toolkit"
  hidden=$(tr ':' '\n' <<<"$PATH" | while read -r d; do [ -x "$d/nvcc" ] || printf '%s:' "$d"; done)
  nocuda() { (cd "$work/src-nocuda" && env PATH="${hidden%:}" CUDA_HOME="$work/no-toolkit" "$@"); }
  nocuda "$work/other/bin/python" setup.py -q build_ext --inplace >"$work/nocuda-build.log" 2>&1
  grep "nostall: building the CPU kernels only: torch $other" "$work/nocuda-build.log"
  version=$(nocuda "$work/other/bin/python" -m nostall.cli --version | tr -s ' \n' ' ')
  echo "$version"
  grep -q "CPU kernels only (torch $other[^ ]* is built for CUDA .* rebuild" <<<"$version"
  nocuda "$work/other/bin/python" -m pytest -q -p no:cacheprovider "${smoke[@]}" | tail -3
  # The README's two commands as such a user types them, the venv the one holding that torch
  # (TORCH_SPEC names it, so make installs no other): `make run`'s job, then `make test`, which
  # adds the dev set and runs the linters and the whole suite.
  echo "== torch $other (CUDA), no CUDA toolkit: make run" >&2
  nocuda make -s run VENV="$work/other" TORCH_SPEC="torch==$other" | tail -3
  echo "== torch $other (CUDA), no CUDA toolkit: make test" >&2
  nocuda make -s test VENV="$work/other" TORCH_SPEC="torch==$other" | tail -15
fi

if [[ " $steps " == *" cuda "* ]] && command -v nvcc >/dev/null; then
  echo "== torch $other (CUDA), no GPU: build from source, CUDA kernels registered" >&2
  # A copy of the tree: pip builds in place, and this build must not touch the dev build's.
  copy_tree "$work/src"
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
# env_step's stream-ordered kernel), the CPU decoder ops have a GPU path in tensor ops, and
# the CPU Adam steps (float32, and master weights from a bf16 gradient) a GPU path in torch's
# fused Adam.
HOST_ONLY = {"env_load", "env_send", "env_set_state", "decode_step", "prefill_prompts",
             "generate_completions", "decoder_train", "decoder_train_backward",
             "decoder_train_backward_into", "clipped_adam_step", "clipped_adam_step_bf16"}
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
  echo "== torch $other (CUDA), no GPU: the suites that call the native code" >&2
  # In the source copy, with the extension just built and installed (its CUDA sources compiled
  # by the build above).
  installed=$(cd "$work/smoke" &&
    "$work/other/bin/python" -c 'import nostall, os; print(os.path.dirname(nostall.__file__))')
  cp "$installed"/_C*.so "$work/src/nostall/"
  suite_deps "$work/other"
  (cd "$work/src" && "$work/other/bin/python" - <<'PY'
import nostall
assert nostall.HAS_CUDA_KERNELS and nostall.__file__.startswith(__import__("os").getcwd()), (
    nostall.__file__)
PY
  )
  (cd "$work/src" && "$work/other/bin/python" -m pytest -q -p no:cacheprovider -x \
    "${native_suites[@]}" | tail -15)
fi
echo "== install check passed" >&2
