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
exec python -m pytest tests "$@"
