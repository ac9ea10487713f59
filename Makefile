# corral: the one entry point. `make help` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

# uv from PATH, else a private copy bootstrapped into .tools/ with python3's venv + pip
# (works on machines where pip may not install into the system Python).
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.tools/bin/uv)
RUN := $(UV) run --frozen

.PHONY: help setup demo test lint format typecheck bench wheels check-wheels check-lowest clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}'

$(CURDIR)/.tools/bin/uv:
	python3 -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/python -m pip install --quiet --disable-pip-version-check uv

setup: $(if $(filter $(CURDIR)/.tools/bin/uv,$(UV)),$(CURDIR)/.tools/bin/uv) ## install uv if missing and sync every package into .venv
	$(UV) sync --all-packages --frozen --quiet

demo: setup ## play the scripted agent session on the embedded default provider
	$(RUN) corral demo

test: setup ## run every package's tests, the conformance suite included
	$(RUN) pytest $(PYTEST_ARGS)

lint: setup ## ruff format --check and ruff check
	$(RUN) ruff format --check .
	$(RUN) ruff check .

format: setup ## apply ruff's formatting and safe fixes
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

typecheck: setup ## mypy --strict over every package's sources
	$(RUN) mypy packages/*/src

bench: setup ## the benchmark table (ratios against baselines measured in the same run)
	$(RUN) python bench/run.py $(BENCH_ARGS)

wheels: setup ## build one wheel per package into dist/
	rm -rf dist
	$(UV) build --all-packages --wheel --out-dir dist --quiet
	@ls dist

check-wheels: wheels ## install each wheel alone in a fresh venv and import it
	bash scripts/check-wheels.sh dist

check-lowest: setup ## core's tests on the lowest versions its dependencies allow
	UV=$(UV) bash scripts/check-lowest.sh

clean: ## remove build output and caches
	rm -rf dist .venv .tools .mypy_cache .ruff_cache .hypothesis
