#!/usr/bin/env bash
# The whole test suite on a fresh machine (idempotent): bash scripts/test.sh [pytest args]
# Triton runs in its interpreter when there is no GPU; the C++ backend must build (a backend that
# is required but unavailable fails the run instead of being skipped).
source "$(dirname "$0")/_env.sh" requirements-test.txt
if python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRIFORCE_REQUIRE_BACKENDS="${TRIFORCE_REQUIRE_BACKENDS:-reference,triton,cpu,cuda}"
else
  export TRIFORCE_REQUIRE_BACKENDS="${TRIFORCE_REQUIRE_BACKENDS:-reference,triton,cpu}"
fi
python -m triforce_kernels
# One pytest worker per CPU (pytest-xdist; TRIFORCE_TEST_WORKERS=N sets the number, 1: one process, whose long
# build checks run on a background thread beside it), each on one CPU thread (OpenMP in two workers would
# oversubscribe the cores); not when the arguments choose workers themselves or only collect.
workers="${TRIFORCE_TEST_WORKERS:-$(nproc)}"
parallel=()
if [ "$workers" -gt 1 ] && python -c "import xdist" 2>/dev/null && ! printf '%s\n' "$@" |
     grep -qE '^(-n|--numprocesses|--co|--collect-only|--pdb|no:xdist|-pno:xdist)$|^-n[0-9a-z]|^--numprocesses='; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TRIFORCE_NUM_THREADS="${TRIFORCE_NUM_THREADS:-1}"
  parallel=(-n "$workers" --dist worksteal)
fi
exec python -m pytest tests "${parallel[@]}" "$@"
