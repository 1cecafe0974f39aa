# LJ RuntimeKit — the targets everyone relies on. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
BUF_VERSION := 1.75.0
VENV := .venv
UV := $(VENV)/bin/uv
PY := $(VENV)/bin/python
BUILD := build
BUF := $(BUILD)/tools/node/node_modules/.bin/buf
COMPONENTS ?= device-plugin scheduler exporter controller job-agent operator
REGISTRY ?= lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit
NODES ?= 3
REAL_NODES ?= 0
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (the suite mostly waits on control planes and nodes, so more
# workers than cores pay off; `0` runs it in one process).
TEST_WORKERS ?= 3
# What lint and images need first; `make test`'s clock sets it empty, having run setup once
# (two setups side by side would write the stubs at the same time).
SETUP ?= setup

export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

.PHONY: setup
setup: $(UV) ## .venv with every package and the generated stubs (idempotent)
	$(UV) sync --locked --all-packages --quiet
	$(MAKE) --no-print-directory generate

.PHONY: generate
generate: ## generate the Python stubs from proto/
	$(PY) proto/generate.py

$(BUF):
	mkdir -p $(BUILD)/tools/node
	npm install --silent --no-audit --no-fund --prefix $(BUILD)/tools/node @bufbuild/buf@$(BUF_VERSION)

.PHONY: buf
buf: $(BUF) ## buf lint and buf breaking against the released v1.13.0 interface
	cd proto && ../$(BUF) lint
	cd proto && ../$(BUF) breaking --against released/v1.13.0

.PHONY: lint
lint: $(SETUP) buf ## ruff, mypy --strict, import-linter contracts, buf lint/breaking
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	tests/tools/typecheck.sh
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/shape_tests/test_drift.py

# The five Go builds, in two chains that `make -j2 k8s-bin` (as `make test` runs it) builds side by
# side. Within a chain a build reuses what the one before put in the Go build cache (the kubelet
# shares most packages with the control plane, nerdctl containerd's with the node's); two builds
# of the same packages at once would both compile them.
BINARY_BUILDS := control-plane node registry nerdctl prometheus
.PHONY: k8s-bin $(addprefix k8s-bin-,$(BINARY_BUILDS))
k8s-bin: $(addprefix k8s-bin-,$(BINARY_BUILDS)) ## build (first time) the test control plane, real-node binaries and Prometheus into ~/.cache/lj-runtimekit
k8s-bin-control-plane:
	tests/cluster/build-binaries.sh
k8s-bin-node: | k8s-bin-control-plane
	tests/cluster/build-node-binaries.sh
k8s-bin-registry:
	tests/cluster/build-registry.sh >/dev/null
k8s-bin-nerdctl: | k8s-bin-node
	tests/cluster/build-nerdctl.sh >/dev/null
k8s-bin-prometheus: | k8s-bin-registry
	tests/monitoring_tests/build-prometheus.sh >/dev/null

.PHONY: isolation
isolation: $(UV) ## each component's tests in a venv that holds only that component
	@for c in $(COMPONENTS); do \
	  echo "== isolated: $$c"; \
	  UV_PROJECT_ENVIRONMENT=$(abspath $(BUILD))/venv-$$c $(UV) sync --locked --package lj-runtimekit-$$c --quiet; \
	  PYTHONPATH=$(abspath proto/src) $(BUILD)/venv-$$c/bin/python -m pytest -q -p no:cacheprovider components/$$c/tests -m "not cluster and not prometheus and not containerd and not realnode and not images"; \
	done

.PHONY: test
test: ## everything from nothing, phases side by side, ending with their clock (the README's test command)
	$(PYTHON) tests/tools/phases.py --make "$(MAKE)" --workers $(TEST_WORKERS)

# Test files run whole on one worker each (module fixtures start once), longest first
# (tests/durations.json); the seconds each file took go to build/test-durations.json.
.PHONY: test-suite
test-suite: ## every package's tests and tests/, real nodes included, in TEST_WORKERS workers
	$(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) \
	  --durations=20 --lj-durations-out=$(BUILD)/test-durations.json \
	  $(PYTEST_ARGS) tests $(wildcard $(foreach c,$(COMPONENTS),components/$(c)/tests))

.PHONY: test-durations
test-durations: ## refresh tests/durations.json (the parallel order) from the last test-suite run
	cp $(BUILD)/test-durations.json tests/durations.json

# The scheduler bench alone (issue 35): every phase at each node count of SCHED_BENCH_NODES, one
# control plane per node count and client setting, then the DRA case and the PodGroup case (one
# control plane per node count); `make bench` runs it too.
SCHED_BENCH_NODES ?= 2000,5000
SCHED_BENCH_ARGS ?=
# The bench's own smoke test at its long row (16 nodes, 60 constrained pods; the suite runs the
# short row): a few minutes, before hours of bench.
.PHONY: bench-scheduler-smoke
bench-scheduler-smoke: setup k8s-bin ## the scheduler bench's smoke test at its long row (test_bench_constrained.py, LJ_SCHED_BENCH_LONG=1)
	LJ_SCHED_BENCH_LONG=1 $(VENV)/bin/pytest -q -p no:cacheprovider -k long components/scheduler/tests/cluster/test_bench_constrained.py

.PHONY: bench-scheduler
bench-scheduler: setup k8s-bin bench-scheduler-smoke ## the scheduler bench alone at SCHED_BENCH_NODES nodes (SCHED_BENCH_ARGS='--clients 5000/5000 --cases classic'); build/bench/scheduler.json and a table
	mkdir -p $(BUILD)/bench
	$(PY) components/scheduler/bench/run.py --out $(BUILD)/bench --nodes $(SCHED_BENCH_NODES) $(SCHED_BENCH_ARGS)
	$(PY) -m lj_runtimekit_testkit.bench table $(BUILD)/bench/scheduler.json

.PHONY: bench
bench: setup k8s-bin ## benchmarks; figures in build/bench/<component>.json and a table
	mkdir -p $(BUILD)/bench
	$(PY) -m lj_runtimekit_testkit.bench run --out $(BUILD)/bench

# The differential harness against kube-scheduler (issue 35 §2): generated cases on a control
# plane of its own; `make test` runs a few hundred of the same seed (tests/oracle_tests).
ORACLE_SEED ?= 35
ORACLE_CASES ?= 5000
ORACLE_ARGS ?=
.PHONY: oracle
oracle: setup k8s-bin ## ORACLE_CASES generated cases (seed ORACLE_SEED) under kube-scheduler and ours, compared; ORACLE_ARGS='--only 17' runs one again
	$(PY) -m lj_runtimekit_testkit.oracle --seed $(ORACLE_SEED) --cases $(ORACLE_CASES) $(ORACLE_ARGS)

.PHONY: cluster-up
cluster-up: setup k8s-bin ## the local control plane with NODES KWOK nodes and REAL_NODES real ones; prints the kubeconfig
	$(VENV)/bin/lj-cluster up --nodes $(NODES) --real-nodes $(REAL_NODES)

.PHONY: cluster-down
cluster-down: $(UV) ## stop the local control plane started by cluster-up
	$(VENV)/bin/lj-cluster down

.PHONY: demo
demo: setup k8s-bin images ## the whole suite end to end on real nodes of a local cluster (ARGS=--once | --keep)
	$(VENV)/bin/python -m lj_runtimekit_testkit.demo $(ARGS)

# v<version> of a component, from its pyproject.toml.
component_version = v$(shell sed -nE 's/^version = "([^"]+)"/\1/p' components/$(1)/pyproject.toml)
bake_var = $(shell echo $(1) | tr a-z- A-Z_)_VERSION

# The image versions docker-bake.hcl reads: each component's own, or lj_runtimekit_version for all.
image_versions = $(if $(lj_runtimekit_version),lj_runtimekit_version=$(lj_runtimekit_version),$(foreach c,$(COMPONENTS),$(call bake_var,$(c))=$(call component_version,$(c))))
# A base image and a uv image from a site's mirror (default: the Dockerfiles' for docker, made
# locally for images).
PYTHON_IMAGE ?=
UV_IMAGE ?=
# `make docker PUSH=1`: push the images to $(REGISTRY) instead of writing OCI archives.
PUSH ?=

.PHONY: docker
docker: $(SETUP) ## the six images from docker-bake.hcl by BuildKit: Docker's buildx, else BuildKit + buildx built here (OCI archives in build/docker, PUSH=1 pushes)
	@if docker buildx version >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  echo "== make docker: docker buildx bake (Docker engine)"; \
	  REGISTRY=$(REGISTRY) $(image_versions) \
	    docker buildx bake $(strip $(if $(PYTHON_IMAGE),--set '*.args.PYTHON_IMAGE=$(PYTHON_IMAGE)') \
	      $(if $(UV_IMAGE),--set '*.args.UV_IMAGE=$(UV_IMAGE)') $(if $(PUSH),--push) $(COMPONENTS)); \
	else \
	  echo "== make docker: no Docker engine: buildx bake on a BuildKit daemon of our own (tests/images/docker-bake.sh)"; \
	  REGISTRY=$(REGISTRY) COMPONENTS="$(COMPONENTS)" UV=$(UV) OUT=$(BUILD)/docker PUSH=$(PUSH) \
	    $(image_versions) PYTHON_IMAGE=$(PYTHON_IMAGE) UV_IMAGE=$(UV_IMAGE) tests/images/docker-bake.sh; \
	fi

# It installs buildah (and debootstrap, once, for the local base image) from Debian when missing,
# and nothing else: skopeo and podman are the bundle tests' own (README, "What each target needs";
# LJ_RUNTIMEKIT_INSTALL_TOOLS=no installs nothing).
.PHONY: images
images: $(SETUP) ## the same images with buildah, no Docker engine: OCI archives + index.json in build/images
	REGISTRY=$(REGISTRY) COMPONENTS="$(COMPONENTS)" UV=$(UV) OUT=$(BUILD)/images $(image_versions) \
	  PYTHON_IMAGE=$(PYTHON_IMAGE) UV_IMAGE=$(UV_IMAGE) tests/images/build-images.sh

# The offline bundle's version (default: the tag every built image shares) and its helm
# (default: helm on PATH, else the harness' pinned one).
VERSION ?=
HELM ?=

.PHONY: bundle
bundle: images ## offline bundle build/bundle/lj-runtimekit-k8s-package.<VERSION>.tar.gz: image installer .run, charts, SHA256SUMS, MANIFEST.json
	helm="$(HELM)"; [[ -n $$helm ]] || helm=$$(command -v helm) || helm=$$(tests/cluster/build-binaries.sh | tail -n 1)/helm; \
	  $(PYTHON) deploy/bundle/build-bundle.py --images $(BUILD)/images/index.json --charts deploy/helm \
	    --out $(BUILD)/bundle --helm "$$helm" $(if $(VERSION),--version $(VERSION))

.PHONY: clean
clean: ## remove build outputs (the binary cache in ~/.cache stays)
	rm -rf $(BUILD) $(VENV) .mypy_cache .ruff_cache .pytest_cache
