# vaecf: `make install` (idempotent) sets up everything; `make demo` and `make test` use it.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOROVOD_VERSION := 0.28.1
DATASET ?= synthetic
SOURCE ?=
STORE ?= demo-output
CONTAINER_TOOL ?= docker
REGISTRY ?= ghcr.io/vaecf
TAG ?= 0.1.0

.PHONY: install test lint demo pipeline images push clean

install: $(STAMP)

# Horovod is built from its sdist against the installed TensorFlow, with the system cmake
# (the PyPI cmake 4.x breaks Horovod's bundled gloo), so it is never in requirements.lock.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip<25" setuptools wheel
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@if $(PY) -c "import horovod, sys; sys.exit(horovod.__version__ != '$(HOROVOD_VERSION)')" 2>/dev/null \
	  && $(BIN)/horovodrun --check-build | grep -q '\[X\] TensorFlow'; then \
	  echo "horovod $(HOROVOD_VERSION) already built"; \
	else \
	  echo "building horovod $(HOROVOD_VERSION) against TensorFlow (a few minutes)"; \
	  PATH=/usr/bin:$$PATH HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir --no-deps horovod==$(HOROVOD_VERSION); \
	fi
	$(BIN)/horovodrun --check-build | tee /dev/stderr | grep -q '\[X\] TensorFlow'
	$(BIN)/horovodrun --check-build | grep -q '\[X\] Gloo'
	touch $(STAMP)

test: install
	$(BIN)/pytest -q tests

lint: install
	$(BIN)/ruff check src tests components pipelines
	$(BIN)/mypy

demo: install
	$(BIN)/vaecf demo --dataset $(DATASET) $(if $(SOURCE),--source $(SOURCE)) --output $(STORE)

clean:
	rm -rf $(VENV) demo-output build *.egg-info
