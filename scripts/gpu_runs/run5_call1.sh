#!/usr/bin/env bash
# GPU run 5, first call: build, the untried tests, the step profiles, the elementwise and eviction benchmarks
set -u
export PYTHONUNBUFFERED=1 TRIFORCE_COMMIT=${TRIFORCE_COMMIT:-unknown} TRIFORCE_BENCH_CSV=/tmp/r/results.csv
R=/tmp/r; mkdir -p $R /tmp/m
END=$((SECONDS + ${BUDGET:-400}))
cp .gpu1/gguf.a /tmp/m/ &
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu1/gguf-*.whl && export PYTHONPATH=/tmp/site
. "$(dirname "${BASH_SOURCE[0]}")/_step.sh"
STAGE_TIMEOUT=120 bash scripts/gpu_check.sh $R/gc build
TAILN=4 step tests 110 env OMP_NUM_THREADS=1 TRIFORCE_NUM_THREADS=1 TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda \
  python3 -m pytest -q -ra -n 14 --timeout 100 -p no:cacheprovider tests/test_cuda_graph_steps.py tests/test_cache.py \
  tests/test_layer_ops.py tests/test_build.py tests/test_engines_robust.py tests/test_verify_attention_window.py \
  tests/test_verify_attention_softcap.py tests/test_verify_attention_leftpad.py tests/test_sliding_window.py \
  tests/test_host_syncs.py --deselect "tests/test_build.py::test_triton_kernels_compile_for_h100[3.6.0]"
P="python3 -m bench.profile_step --top 14 --reps 10"
TAILN=0 step prof_smol 60 $P --model smollm2-135m --batch 32 256 --context 264 4000
TAILN=0 step prof_smol_unfused 50 env TRIFORCE_FUSED_ELEMENTWISE=0 $P --model smollm2-135m --batch 32 256 --context 264 4000
TAILN=0 step prof_stream 40 $P --model smollm2-135m --batch 32 256 --context 256 --streaming
TAILN=0 step prof_llama 60 $P --model llama3-8b --batch 1 --context 4224 --tokens 3
grep -H "^batch" $R/prof_*.log | cut -c1-220
step layer_ops 40 python3 -m bench.bench_layer_ops
step stream_cache 45 python3 -m bench.bench_streaming_cache --device cuda --model random --batch 32 256 --dtype bfloat16 --context 4000
step va_window 40 python3 -m bench.bench_verify_attention --batch 8 --context 131072 --widths 1,16 --window 4096
step va_softcap 40 python3 -m bench.bench_verify_attention --batch 8 --context 131072 --widths 1,16 --softcap 50
tar czf $OUT/r.tgz -C /tmp r && ls -la $OUT
