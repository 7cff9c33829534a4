# Two set-up commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: demo test install install-test bench clean

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

clean:
	rm -rf $(VENV) outputs/demo .pytest_cache
