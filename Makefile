# servinglab developer tasks. `make help` lists them. Everything runs from a project-local .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.DEFAULT_GOAL := help
.PHONY: help setup demo smoke test lint typecheck unit integration k8s control-plane triton-env chart-crd images gpu-check outdated clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check pip==25.3
	$(BIN)/python -m pip install -q -e . --group dev
	rm -f $(VENV)/.installed-*; touch $@

setup: $(STAMP) ## create .venv with pinned dependencies (torch, TorchServe, Locust, ...)

demo: setup ## run the ResNet-50 demo experiment locally (results in results-demo.json)
	$(BIN)/servinglab run examples/experiment-demo.yaml --output results-demo.json

smoke: setup ## run the tiny smoke experiment (under a minute)
	$(BIN)/servinglab run examples/experiment-smoke.yaml --output results-smoke.json

lint: setup ## ruff lint and format check; the package's layers and import contracts (.importlinter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: setup ## mypy --strict on the servinglab package
	$(BIN)/mypy

unit: setup ## fast tests (no TorchServe)
	$(BIN)/pytest tests/unit

integration: setup triton-env ## tests that start a real TorchServe or Triton
	$(BIN)/pytest tests/integration

triton-env: setup ## the Triton environment (tritonserver, its Python backend, perf_analyzer), cached by content
	hack/triton-env.sh

control-plane: ## build (or reuse the cached) Kubernetes binaries, etcd, KWOK, helm and CoreDNS from Go modules (both parts: cluster, node)
	hack/build-control-plane.sh

images: ## build the operator, servinglab and Triton images (docker, else podman; README "Images")
	SERVER_IMAGES=1 hack/images.sh

chart-crd: setup ## regenerate the chart's CRD from the spec model
	$(BIN)/servinglab crd > charts/serving/files/crd-servingexperiments.yaml
	$(BIN)/servinglab crd --kind sweep > charts/serving/files/crd-servingsweeps.yaml

k8s: setup control-plane triton-env ## tests against the local Kubernetes control plane
	$(BIN)/pytest tests/k8s

test: setup triton-env ## everything CI runs: lint, types, every test (slow parts side by side: hack/test.sh)
	hack/test.sh

gpu-check: ## the one GPU check on a GPU machine (JSON + Markdown in gpu-check/); DRY_RUN=1: its CPU dry run
	hack/gpu-check.sh

outdated: setup ## list the pinned dependencies with a newer release on PyPI (changes no pin)
	$(BIN)/python hack/outdated.py

clean: ## remove build outputs (keeps .venv)
	rm -rf model-store/build .pytest_cache .mypy_cache .ruff_cache results-*.json
