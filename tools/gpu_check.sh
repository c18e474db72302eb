#!/usr/bin/env bash
# Every GPU check in one run, for a machine with a CUDA build of torch already installed and no
# network: builds nostall in place against that torch (the CUDA kernels included), then runs the
# tests marked `gpu` (kernels against the CPU ones with sync debug mode on, the trainers with
# --device cuda) and short GPU training runs (PPO; GRPO steps of a 135M-shaped model in bf16).
# Logs go to $OUT (default: gpu-check/).
#
#   bash tools/gpu_check.sh            # about 6 minutes on one GPU
#
# Python packages the machine lacks (gymnasium, say) must travel as wheels: put them in .whl/
# (ignored by git) and they are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

$py - <<'EOF' || exit 1
import importlib, torch
assert torch.cuda.is_available(), "no CUDA device: nothing to check here"
print("torch", torch.__version__, "on", torch.cuda.get_device_name())
missing = [m for m in ("gymnasium", "hypothesis", "pytest", "tqdm", "matplotlib", "tensorboard",
                      "transformers")
           if importlib.util.find_spec(m) is None]
assert not missing, f"missing Python packages (carry them as wheels in .whl/): {missing}"
EOF

echo "== build (CUDA kernels included)"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
$py setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
$py -c "import nostall; assert nostall.HAS_CUDA_KERNELS, 'CUDA kernels not built'; print('CUDA kernels loaded')" || exit 1

echo "== tests marked gpu"
# Every failure, not the first: a lent machine is short-lived. Each test is bounded where
# pytest-timeout is installed, and the whole part by TESTS_TIMEOUT seconds.
per_test=()
$py -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout "${TEST_TIMEOUT:-120}")
timeout "${TESTS_TIMEOUT:-1200}" $py -m pytest -q -m gpu -p no:cacheprovider "${per_test[@]}" \
  --durations 12 2>&1 | tee "$out/gpu_tests.log" | tail -60
status=${PIPESTATUS[0]}

echo "== PPO on CartPole-v1, trainer on the GPU"
timeout "${RUN_TIMEOUT:-600}" $py -m nostall.cli train ppo --env CartPole-v1 --device cuda --no-progress \
  --out "$out/ppo-cuda" 2>&1 | tee "$out/train.log" | tail -8

echo "== GRPO on the 135M-shaped model: bf16 steps, syncs per decode step and per update"
for staleness in 0 1; do
  timeout "${RUN_TIMEOUT:-600}" $py -m benchmarks.lm.gpu_step --staleness "$staleness" 2>&1 |
    tee "$out/grpo_135m_s$staleness.log" | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit "$status"
