#!/usr/bin/env bash
# The prepared GPU check (scripts/gpu_check.py): an FSDP2 + LoRA GRPO step of our trainer code and HFEngine on one
# GPU, without Ray. Two halves:
#
#   bash scripts/gpu_check.sh wheels     # here, with the registry: the packages the GPU machine lacks, as wheels
#                                        # for its Python 3.12 in .whl/ (versions = this project's venv)
#   bash scripts/gpu_check.sh [ARGS...]  # there: installs .whl/ into /tmp/site, runs the check on CUDA
#
# With the device tool: run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600).
# The GPU machine has torch 2.11 (CUDA), numpy, pandas, safetensors, huggingface_hub, accelerate; it lacks verl and
# its pure-Python needs, pydantic, tensordict, and our pinned transformers/tokenizers/peft. Ray's wheel is too large
# to carry: the check registers a stand-in for verl's module-level `import ray` (see gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."

# distribution names, pinned below to what .venv has
CARRIED="verl omegaconf antlr4-python3-runtime codetiming dill orjson pydantic pydantic-core annotated-types
typing-inspection pyvers tensordict zstandard transformers tokenizers peft"

if [[ "${1:-}" == "wheels" ]]; then
  PY=.venv/bin/python
  [[ -x $PY ]] || { echo "error: no .venv here; run make test or make demo first" >&2; exit 2; }
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  rm -rf .whl && mkdir -p .whl
  pins=()
  for dist in $CARRIED; do
    version=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$dist") \
      || { echo "error: $dist is not installed in .venv" >&2; exit 2; }
    pins+=("$dist==$version")
  done
  # antlr4-python3-runtime 4.9.3 (omegaconf's pin) exists only as an sdist: build its pure-Python wheel here
  binary=() sdist=()
  for pin in "${pins[@]}"; do
    if [[ $pin == antlr4-python3-runtime==* ]]; then sdist+=("$pin"); else binary+=("$pin"); fi
  done
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${binary[@]}" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  $PY -m pip wheel -q --no-deps -w .whl "${sdist[@]}" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (carry it: the limit is 64 MiB with the tree)"
  ls .whl
  exit 0
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
python3 scripts/gpu_check.py --device cuda "$@"
