#!/usr/bin/env bash
# GPU run 5, call 2: the build in the background (setsid: it outlives this call), the untried GPU tests on
# the Triton backends, the soft-capped attention; the model's first half kept in /tmp for the next call
set -u
export PYTHONUNBUFFERED=1 TRIFORCE_COMMIT=${TRIFORCE_COMMIT:-unknown} TRIFORCE_BENCH_CSV=/tmp/r/results.csv
R=/tmp/r; mkdir -p $R /tmp/m; cp .gpu1/gguf.a /tmp/m/ &
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu1/gguf-*.whl
setsid nohup bash -c "MAX_JOBS=6 python3 -m pip install --no-deps --no-build-isolation -v -e . > /tmp/build.log 2>&1; echo rc=\$? >> /tmp/build.log" >/dev/null 2>&1 &
t0=$SECONDS
timeout -k 5 ${TLIM:-105} env OMP_NUM_THREADS=1 TRIFORCE_NUM_THREADS=1 TRIFORCE_REQUIRE_BACKENDS=reference,triton \
  python3 -m pytest -v -n 12 --timeout 90 -p no:cacheprovider tests/test_cuda_graph_steps.py tests/test_cache.py \
  tests/test_layer_ops.py tests/test_engines_robust.py tests/test_verify_attention_window.py \
  tests/test_verify_attention_softcap.py tests/test_verify_attention_leftpad.py tests/test_sliding_window.py \
  tests/test_host_syncs.py > $R/tests.log 2>&1; echo "tests rc=$? $((SECONDS - t0)) s"
grep -E "(PASSED|FAILED|ERROR|SKIPPED)" $R/tests.log | sed -E 's/.*(PASSED|FAILED|ERROR|SKIPPED).*/\1/' | sort | uniq -c
grep -E "FAILED|ERROR" $R/tests.log | grep -o "tests/[^ ]*" | sort -u | head -30
timeout -k 5 35 python3 -m bench.bench_verify_attention --batch 8 --context 131072 --widths 1,16 --softcap 50 > $R/va_softcap.log 2>&1
tail -6 $R/va_softcap.log | cut -c1-220; tail -2 /tmp/build.log | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r; ls /tmp/m
