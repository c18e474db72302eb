#!/usr/bin/env bash
# `make sanitize`: the native libraries built with sanitizers in a copy of the source tree, each
# build running the tests that exercise it.
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (-fno-wrapv, so signed overflow is
#         caught), over the environment, op, runtime and trainer tests.
#   tsan: ThreadSanitizer over the multi-threaded environment tests and the two-thread stress
#         test.
# Python itself is not instrumented: libasan/libtsan are preloaded (ASan also needs libstdc++
# preloaded beside it, or the first C++ exception aborts), and the interpreter's own frames are
# suppressed (tools/sanitizers/*.supp). Any report in nostall's frames fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$root/.venv/bin/python}
modes=${*:-asan tsan}
cxx=${CXX:-g++}

copy_tree() {  # the tracked and untracked-but-not-ignored files, without build outputs
  local dest=$1
  rm -rf "$dest"
  mkdir -p "$dest"
  (cd "$root" && git ls-files -co --exclude-standard | grep -v '^build/' | tar -cf - -T -) |
    tar -xf - -C "$dest"
}

for mode in $modes; do
  work=$root/build/sanitize/$mode
  copy_tree "$work"
  cd "$work"
  case $mode in
    asan)
      flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fno-wrapv -g"
      preload="$($cxx -print-file-name=libasan.so):$($cxx -print-file-name=libstdc++.so)"
      export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:symbolize=1:log_path=$work/report"
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$work/report:suppressions=$root/tools/sanitizers/ubsan.supp"
      tests=(tests/envs tests/ops tests/runtime tests/algos/ppo/test_trainers.py tests/lm/test_sample_tokens.py
             tests/lm/test_generation.py tests/lm/test_decoder_train.py
             tests/lm/test_generate_completions.py tests/algos/grpo/test_explicit_update.py tests/lm/test_native_bf16.py
             tests/test_optim.py tests/agents/test_continuous.py)
      # Not the Ray backend's tests: Ray's own binaries (raylet, GCS) would start under the
      # preloaded sanitizer; its workers make the native calls the other runtime tests make.
      select=(-k "not peak_memory and not cuda and not solves and not learns and not improves"
              --ignore=tests/runtime/ray)
      # On make test's workers (each a process under the same preload, its reports to its own
      # log_path.pid file).
      workers=(-n "${TEST_WORKERS:-2}" --dist loadfile)
      ;;
    tsan)
      # No AVX2 clones: their load-time resolvers crash under TSan (csrc/ops/decoder_core.h).
      flags="-fsanitize=thread -fno-omit-frame-pointer -g -DNOSTALL_NO_CLONES"
      preload="$($cxx -print-file-name=libtsan.so)"
      export TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:log_path=$work/report:suppressions=$root/tools/sanitizers/tsan.supp"
      tests=(tests/envs/test_env_threads.py tests/envs/test_vector_api.py tests/envs/test_env_errors.py)
      select=()
      workers=()
      ;;
    *) echo "unknown sanitizer mode $mode (asan, tsan)" >&2; exit 2 ;;
  esac
  echo "== $mode: building" >&2
  NOSTALL_NO_CUDA=1 CFLAGS="$flags" LDFLAGS="${flags%% *}" "$py" setup.py -q build_ext --inplace \
    >build.log 2>&1 || { tail -30 build.log; exit 1; }
  echo "== $mode: ${tests[*]}" >&2
  # setarch -R: TSan needs the layout it expects (no high-entropy randomisation). Reports go
  # to files (pytest's capture would swallow a report that halts the process): shown on failure.
  rm -f "$work"/report.*
  status=0
  LD_PRELOAD="$preload" setarch "$(uname -m)" -R "$py" -m pytest -q -p no:cacheprovider \
    "${workers[@]}" "${tests[@]}" "${select[@]}" || status=$?
  if compgen -G "$work/report.*" >/dev/null; then
    cat "$work"/report.* >&2
    echo "== $mode: sanitizer reports above" >&2
    exit 1
  fi
  [ "$status" -eq 0 ] || exit "$status"
  echo "== $mode: clean" >&2
done
