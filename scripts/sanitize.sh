#!/usr/bin/env bash
# The native code under AddressSanitizer + UndefinedBehaviorSanitizer:
#
#   bash scripts/sanitize.sh [pytest args]
#
# 1. the torch-free C++ unit tests (csrc/tests), built by CMake with -DTRIFORCE_SANITIZE=ON, under ctest;
# 2. the extension triforce_kernels._C built with TRIFORCE_SANITIZE=1 into $TRIFORCE_SANITIZE_DIR
#    (default build/sanitize) -- the package's own _C is left alone;
# 3. the op tests on the C++ and reference backends with that build loaded (TRIFORCE_EXT_PATH) and
#    the sanitizer runtimes preloaded into Python. Extra arguments go to pytest (default: the op
#    test files without the Triton and CUDA parameters). Any finding aborts the run with a report and a stack trace.
#
# Environment: TRIFORCE_SANITIZE_DIR (build directory), TRIFORCE_SANITIZE_STEPS (default
# "ctest build pytest"), MAX_JOBS (compile jobs, default 2), TRIFORCE_VENV (default .venv).
# For the fuzz profile under the sanitizers, e.g.:
#   HYPOTHESIS_PROFILE=fuzz TRIFORCE_FUZZ_EXAMPLES=100000 bash scripts/sanitize.sh tests/test_tree_mask.py
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
DIR="${TRIFORCE_SANITIZE_DIR:-$ROOT/build/sanitize}"
STEPS="${TRIFORCE_SANITIZE_STEPS:-ctest build pytest}"
VENV="${TRIFORCE_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || { echo "no virtualenv at $VENV: run bash scripts/test.sh once first" >&2; exit 1; }
# shellcheck disable=SC1091
. "$VENV/bin/activate"
mkdir -p "$DIR"

# Python leaks by design (interned objects, extension modules): leak checking would only report those.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

has_step() { [[ " $STEPS " == *" $1 "* ]]; }

if has_step ctest; then
  echo "== C++ unit tests (ctest) with -fsanitize=address,undefined"
  cmake -S . -B "$DIR/cmake" -DCMAKE_BUILD_TYPE=Debug -DTRIFORCE_SANITIZE=ON >/dev/null
  cmake --build "$DIR/cmake" -j "${MAX_JOBS:-2}" >/dev/null
  # No fake stack here: gcc 12 aligns ASan's fake stack frames to 32 bytes, while -march=native code
  # keeps 64-byte aligned AVX-512 stack arrays (vmovdqa64 on a 16-int initializer list in
  # test_retrieval's main): a SIGSEGV of the tool, not a finding. Everything else stays checked.
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_stack_use_after_return=0" ctest --test-dir "$DIR/cmake" --output-on-failure
fi

if has_step build; then
  echo "== triforce_kernels._C with TRIFORCE_SANITIZE=1 -> $DIR/lib"
  TRIFORCE_SANITIZE=1 MAX_JOBS="${MAX_JOBS:-2}" python setup.py -q build_ext \
    --build-lib "$DIR/lib" --build-temp "$DIR/tmp" >"$DIR/build.log" 2>&1 \
    || { tail -50 "$DIR/build.log"; exit 1; }
fi

if has_step pytest; then
  EXT="$(ls "$DIR"/lib/triforce_kernels/_C*.so)"
  export TRIFORCE_EXT_PATH="$EXT"
  # The ASan runtime must be the first library loaded (before python's own); UBSan's with it.
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
  export TRIFORCE_REQUIRE_BACKENDS=reference,cpu
  python - <<'EOF'
import os, torch, triforce_kernels._backend as b
mod, why = b._extension()
assert mod is not None, why
assert os.path.samefile(mod.__file__, os.environ["TRIFORCE_EXT_PATH"]), mod.__file__
print("== op tests with the sanitized extension", mod.__file__)
EOF
  if [ $# -eq 0 ]; then
    set -- tests/test_chunk_mean_keys.py tests/test_retrieval.py tests/test_verify_attention.py \
      tests/test_tree_mask.py tests/test_sampling.py tests/test_sampling_stats.py tests/test_linear.py \
      tests/test_quant.py tests/test_decoder.py -k "not triton and not cuda" -q
  fi
  # --capture=sys: the sanitizers write their reports to fd 2 and then end the process, so pytest must
  # not be capturing at the file-descriptor level (the report would be lost with the process).
  python -m pytest -p no:cacheprovider --capture=sys "$@"
fi
