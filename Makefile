# Everything a fresh machine needs is installed from here: `make run`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck unit bench bench-overhead bench-stream-timing \
	bench-cancellation bench-scale bench-slow-clients bench-chunk-path mutation clean

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

# The benchmark suite (docs/benchmarks.md): not part of `make test` (a smoke run of each scenario
# is: tests/e2e/test_bench_smoke.py). Plots need the bench extra (matplotlib).
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.suite $(BENCH_ARGS)

bench-overhead: $(BENCH_STAMP)
	$(BIN)/python -m bench.overhead $(BENCH_ARGS)

bench-stream-timing: $(BENCH_STAMP)
	$(BIN)/python -m bench.stream_timing $(BENCH_ARGS)

bench-cancellation: $(BENCH_STAMP)
	$(BIN)/python -m bench.cancellation $(BENCH_ARGS)

bench-scale: $(BENCH_STAMP)
	$(BIN)/python -m bench.scale $(BENCH_ARGS)

bench-slow-clients: $(BENCH_STAMP)
	$(BIN)/python -m bench.slow_clients $(BENCH_ARGS)

bench-chunk-path: $(STAMP)
	$(BIN)/python -m bench.chunk_path $(BENCH_ARGS)

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
