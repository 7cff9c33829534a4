# Two set-up commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: demo test install install-test bench trainers-check conformance clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_FLAGS) --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) -e '.[notebooks,tokenizers]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

install: $(VENV)/.installed-demo

install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(BIN)/workbench demo --out outputs/demo

test: $(VENV)/.installed-test
	./scripts/ci_install_browser.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python bench/scan.py
	$(BIN)/python bench/dispatch.py

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

clean:
	rm -rf $(VENV) outputs/demo .pytest_cache
