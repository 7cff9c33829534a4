# Two set-up commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: demo test install install-test bench peers trainers-check conformance real-sglang real-sglang-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_FLAGS) --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) -e '.[notebooks,tokenizers,fast]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

install: $(VENV)/.installed-demo

install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(BIN)/workbench demo --out outputs/demo

# The suite on TEST_WORKERS parallel workers that steal work from each other (pytest-xdist):
# most tests wait on a server, a kernel or a browser, so more workers than cores keep both
# cores busy. The package's picture (sizes, imports) first, the 20 slowest tests last.
TEST_WORKERS ?= 4

test: $(VENV)/.installed-test
	./scripts/ci_install_system.sh
	$(BIN)/python tests/test_layout.py
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=20 $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python bench/scan.py
	$(BIN)/python bench/dispatch.py

# The workbench against DuckDB, polars and datasketch on a run written elsewhere (bench/peers.py;
# PEERS_ARGS=--size-mb 1000 for the size of a real job).
$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-test
	$(BIN)/pip install $(PIP_FLAGS) -e '.[test,bench]'
	touch $@

peers: $(VENV)/.installed-bench
	$(BIN)/python bench/peers.py $(PEERS_ARGS)

# Optional: a demo run's exports loaded by SpecForge's and vLLM speculators' own loaders, in a
# separate venv (they pull torch; never part of `make test`). Only their data loaders run here,
# so their GPU-serving dependencies (sglang, flash-attn, vllm) are left out.
TRAINERS_VENV ?= .venv-trainers
TRAINERS_OUT ?= outputs/trainers-check
TRAINERS := specforge==0.2.0 speculators==0.9.0
TRAINERS_DEPS := torch==2.11.0 transformers==5.8.1 'datasets>=4.0.0,<=5.1.0' accelerate \
	pydantic pydantic-settings loguru typer rich safetensors tqdm pyyaml psutil numpy httpx \
	click 'openai>=2.0.0' aiohttp protobuf hs-connectors==0.9.0

$(TRAINERS_VENV)/.installed:
	$(PYTHON) -m venv $(TRAINERS_VENV)
	$(TRAINERS_VENV)/bin/pip install $(PIP_FLAGS) $(TRAINERS_DEPS)
	$(TRAINERS_VENV)/bin/pip install $(PIP_FLAGS) --no-deps $(TRAINERS)
	touch $@

trainers-check: $(VENV)/.installed-test $(TRAINERS_VENV)/.installed
	$(BIN)/python scripts/trainers_check.py export $(TRAINERS_OUT)
	$(TRAINERS_VENV)/bin/python scripts/trainers_check.py load $(TRAINERS_OUT)

# Optional: SGLang's own clients (bench_serving, bench_one_batch_server, sglang.lang's
# RuntimeEndpoint, send_one) against the simulator, each run's counts checked against /metrics.
# SGLang is installed with --no-deps beside the pinned imports of its client modules (torch
# among them: about 6 GB), in a separate venv; never part of `make test`.
CONFORMANCE_VENV ?= .venv-conformance
SGLANG_VERSION := 0.5.23

$(CONFORMANCE_VENV)/.installed: scripts/conformance-requirements.txt
	$(PYTHON) -m venv $(CONFORMANCE_VENV)
	$(CONFORMANCE_VENV)/bin/pip install $(PIP_FLAGS) --no-deps -r scripts/conformance-requirements.txt
	$(CONFORMANCE_VENV)/bin/pip install $(PIP_FLAGS) --no-deps sglang==$(SGLANG_VERSION)
	touch $@

conformance: $(VENV)/.installed-test $(CONFORMANCE_VENV)/.installed
	$(CONFORMANCE_VENV)/bin/python scripts/conformance.py --workbench $(BIN)/workbench

# Optional: a real SGLang server on this machine (no GPU needed): SGLang in .venv-sglang and a
# tiny random-weight model folder (2 layers, the example tokenizer; --load-format dummy).
# On a GPU host: `make real-sglang SGLANG_MODE=gpu` installs the registry's CUDA build, and
# SGLANG_MODEL=/path/to/model points the check at a real model folder instead of the dummy.
# Never part of `make test` (6.5 GB).
SGLANG_VENV ?= .venv-sglang
SGLANG_MODE ?= cpu
SGLANG_MODEL ?= outputs/real-sglang/model
SGLANG_CHECK_OUT ?= outputs/real-sglang-check

$(SGLANG_VENV)/.installed-$(SGLANG_MODE): scripts/install_real_sglang.sh scripts/conformance-requirements.txt
	SGLANG_VERSION=$(SGLANG_VERSION) PYTHON=$(PYTHON) ./scripts/install_real_sglang.sh $(SGLANG_VENV) $(SGLANG_MODE)
	touch $@

real-sglang: $(VENV)/.installed-test $(SGLANG_VENV)/.installed-$(SGLANG_MODE)
	@if [ "$(SGLANG_MODEL)" = outputs/real-sglang/model ]; then \
		$(BIN)/python -m workbench.server.dummy_model $(SGLANG_MODEL); fi
	@echo "SGLang: $(SGLANG_VENV)/bin/python -m sglang.launch_server --model-path $(SGLANG_MODEL) ..."
	@echo "(README: 'A real SGLang server on this machine')"

real-sglang-check: real-sglang
	$(BIN)/python scripts/real_sglang_check.py --sglang-python $(SGLANG_VENV)/bin/python \
		--model $(SGLANG_MODEL) --out $(SGLANG_CHECK_OUT) --mode $(SGLANG_MODE)

clean:
	rm -rf $(VENV) outputs/demo .pytest_cache
