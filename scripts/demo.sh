#!/usr/bin/env bash
# The main job on a fresh machine (idempotent): the long-context demo on the embedded SmolLM2-135M.
# bash scripts/demo.sh [triforce demo options]
source "$(dirname "$0")/_env.sh" requirements.txt
python -m triforce_kernels
exec python -m triforce demo "$@"
