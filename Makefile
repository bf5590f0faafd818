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
# TensorFlow's C++ start-up banners (oneDNN, CPU features) are noise in every stage's log.
TF_CPP_MIN_LOG_LEVEL ?= 2
export TF_CPP_MIN_LOG_LEVEL

.PHONY: install test lint demo docs docs-build pipeline images image-check push clean

install: $(STAMP)

# Horovod is built from its sdist against the installed TensorFlow, with the system cmake
# (the PyPI cmake 4.x breaks Horovod's bundled gloo), so it is never in requirements.lock.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip<25" setuptools wheel
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@if $(PY) -c "import horovod.tensorflow, sys; sys.exit(horovod.__version__ != '$(HOROVOD_VERSION)')" \
	  2>/dev/null; then \
	  echo "horovod $(HOROVOD_VERSION) already built"; \
	else \
	  echo "building horovod $(HOROVOD_VERSION) against TensorFlow (a few minutes)"; \
	  PATH=/usr/bin:$$PATH HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir --no-deps horovod==$(HOROVOD_VERSION); \
	fi
	@build=$$($(BIN)/horovodrun --check-build) && echo "$$build" \
	  && grep -q '\[X\] TensorFlow' <<< "$$build" && grep -q '\[X\] Gloo' <<< "$$build"
	touch $(STAMP)

# Two pytest-xdist workers, each taking whole test files (tests/conftest.py: the horovodrun
# files as one unit); TEST_WORKERS=0 runs in one process. Each run prints the suite's time and
# its 10 slowest tests; pyproject.toml fails a test that passes 60 s (300 s if marked slow).
TEST_WORKERS ?= 2
test: install
	$(BIN)/pytest -q -n $(TEST_WORKERS) --durations=10 tests

# lint-imports: the layers of docs/concepts/architecture.md (contracts in pyproject.toml).
lint: install
	$(BIN)/ruff check src tests components pipelines docs/hooks
	$(BIN)/mypy
	PYTHONPATH=src:. $(BIN)/lint-imports

demo: install
	$(BIN)/vaecf demo --dataset $(DATASET) $(if $(SOURCE),--source $(SOURCE)) --output $(STORE)

# The documentation site (mkdocs.yml, docs/): `make docs` serves it on http://127.0.0.1:8000
# and rebuilds on every edit; `make docs-build` builds it into site/ with --strict (a broken
# link or a page missing from the nav fails), as the tests do. The CLI and pipeline reference
# pages are generated from the parsers at build time (docs/hooks/reference.py).
DOCS_ENV := NO_MKDOCS_2_WARNING=1 PYTHONPATH=src:.
docs: install
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict

docs-build: install
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) demo-output build site *.egg-info

# Images, registry push with recorded digests, and the compiled KFP pipeline.
IMAGES := data train launcher serve spark
DIGESTS ?= build/digests.json
PIPELINE_YAML ?= build/vaecf_pipeline.yaml
SWEEP_YAML ?= build/vaecf_sweep.yaml

images:
	@for name in $(IMAGES); do \
	  echo "building $(REGISTRY)/vaecf-$$name:$(TAG)"; \
	  $(CONTAINER_TOOL) build -f docker/$$name.Dockerfile -t $(REGISTRY)/vaecf-$$name:$(TAG) . \
	    || exit 1; \
	done
	$(CONTAINER_TOOL) build -f docker/train.Dockerfile --build-arg FLAVOUR=cpu \
	  -t $(REGISTRY)/vaecf-train-cpu:$(TAG) .

# Builds the data, launcher, serve, Spark and both train images with buildah on a bootstrapped
# stand-in for their base, runs them and removes them (see docker/check-images.sh; root,
# Debian; ~12 minutes on 2 cores, ~30 GB of free disk). IMAGE_CHECK=spark (names from the
# script's list) checks only those images and the ones their checks take data from.
IMAGE_CHECK ?=
image-check:
	docker/check-images.sh $(IMAGE_CHECK)

# Pushes the images and records their registry digests in $(DIGESTS); `make pipeline` then
# pins every image by digest (delete the file to compile with tags again). The CPU train image
# (manifests/overlays/cpu) is pushed by tag: the pipeline's default train image is the GPU one.
push: images
	@mkdir -p $(dir $(DIGESTS))
	@sep=""; json="{"; for name in $(IMAGES); do \
	  image=$(REGISTRY)/vaecf-$$name; \
	  $(CONTAINER_TOOL) push $$image:$(TAG) || exit 1; \
	  digest=$$($(CONTAINER_TOOL) image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' \
	    $$image:$(TAG) | grep "^$$image@sha256:" | head -n 1 | cut -d@ -f2); \
	  test -n "$$digest" || { echo "no registry digest for $$image:$(TAG)"; exit 1; }; \
	  json="$$json$$sep\"$$name\": \"$$digest\""; sep=", "; \
	done; echo "$$json}" > $(DIGESTS); echo "digests recorded in $(DIGESTS):"; cat $(DIGESTS)
	$(CONTAINER_TOOL) push $(REGISTRY)/vaecf-train-cpu:$(TAG)

pipeline: install
	$(PY) -m pipelines.vaecf_pipeline --output $(PIPELINE_YAML) --registry $(REGISTRY) \
	  --tag $(TAG) $(if $(wildcard $(DIGESTS)),--digests $(DIGESTS))
	$(PY) -m pipelines.vaecf_sweep --output $(SWEEP_YAML) --registry $(REGISTRY) \
	  --tag $(TAG) $(if $(wildcard $(DIGESTS)),--digests $(DIGESTS)) \
	  $(if $(TRIALS),--trials $(TRIALS))
