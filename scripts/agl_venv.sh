#!/usr/bin/env bash
# Make an Agent Lightning environment: agentlightning never goes into the project's .venv (1.0.2 declares
# Python >= 3.12; 0.3.0 moves five of our pins).
#   scripts/agl_venv.sh [DEST [REQUIREMENTS [PIP_ARGS...]]]
# Default: .venv-agl from requirements/agentlightning.txt (1.x). PIP_ARGS are installed after the requirements
# (0.3.x: the tandem_rl_agl package). Uses python3.12/3.13 (on PATH, or a pyenv version) where present;
# otherwise python3 with --ignore-requires-python (1.x's code runs on 3.11) and says so. Idempotent: a finished
# venv has .ready.
set -euo pipefail
dest=${1:-.venv-agl}
root=$(cd "$(dirname "$0")/.." && pwd)
requirements=${2:-$root/requirements/agentlightning.txt}
shift $(( $# > 2 ? 2 : $# ))
[ -f "$dest/.ready" ] && exit 0
py="" extra=""
for candidate in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
    py=$candidate; break
  fi
done
if [ -z "$py" ]; then
  py=python3 extra=--ignore-requires-python
  echo "agl_venv: no Python >= 3.12 here; installing agentlightning on $(python3 -V) with --ignore-requires-python"
fi
rm -rf "$dest"
"$py" -m venv "$dest"
"$dest/bin/pip" install -q $extra -r "$requirements" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
LITELLM_LOCAL_MODEL_COST_MAP=True "$dest/bin/python" -c 'import sys, agentlightning; print(f"python {sys.version.split()[0]}, agentlightning {agentlightning.__version__}")' > "$dest/.ready"
echo "agl_venv: $(cat "$dest/.ready") in $dest"
