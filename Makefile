# Everything a fresh machine needs is installed from here: `make run`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck unit bench mutation clean

# Serving needs the package alone; the tests add their tools (SDKs, pytest, ruff, mypy).
RUN_STAMP := $(VENV)/.run-stamp

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/trio-gateway serve --config gateway.toml

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The status page is tested in a real headless browser: Debian's chromium.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(CHROMIUM):
	$(SUDO) apt-get install -y -q --no-install-recommends chromium \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends chromium)

unit: $(STAMP) $(CHROMIUM)
	$(BIN)/pytest -q -m "not vllm"

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench.cancellation $(BENCH_ARGS)

MUTATION_STAMP := $(VENV)/.mutation-stamp

$(MUTATION_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

# Mutation testing of the core (docs/testing.md, "Mutation testing"): not part of `make test`.
# mutmut copies the tree into mutants/; a stale copy would test old code, so it starts clean.
mutation: $(MUTATION_STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(or $(MUTATION_JOBS),2)
	$(BIN)/python tools/mutation/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis mutants

-include tools/vllm/Makefile.inc
