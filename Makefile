# Everything a fresh machine needs is installed from here: `make run`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck unit bench bench-all bench-overhead bench-stream-timing \
	bench-cancellation bench-scale bench-slow-clients bench-fleet bench-priority bench-chunk-path \
	bench-vllm \
	mutation mutation-core mutation-providers mutation-money mutation-lock wheel clean

# Serving needs the package (with the tracing extra: [tracing] in a config needs it); the tests
# add their tools (SDKs, pytest, ruff, mypy).
RUN_STAMP := $(VENV)/.run-stamp

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[tracing]'
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,tracing]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

# A wheel to install on a host without this checkout: `pip install dist/trio_gateway-*.whl`.
# (No package named trio-gateway is published on PyPI.)
wheel: $(RUN_STAMP)
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir dist .

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

# Budgets, rate limits and the usage stream are tested against a real redis-server (started by
# the tests on a free port); a listening socket's backlog is read with iproute2's ss.
REDIS_SERVER := /usr/bin/redis-server
SS := /usr/bin/ss
APT_GET = $(SUDO) apt-get install -y -q --no-install-recommends $(1) \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends $(1))

$(REDIS_SERVER):
	$(call APT_GET,redis-server)

$(SS):
	$(call APT_GET,iproute2)

# deploy/nginx/trio-gateway.conf is tested in a real nginx in front of a real gateway
# (tests/e2e/test_deploy_nginx.py, test_h1_behind_nginx.py; tests/e2e/nginx.py runs its own
# nginx, as any user, on a free port).
# (Where services may start, i.e. not in a container with policy-rc.d, installing the package
# also starts Debian's own nginx on port 80; the tests do not use it.)
NGINX := /usr/sbin/nginx

$(NGINX):
	$(call APT_GET,nginx)

# Two test processes where there are two cores (pytest-xdist): half the time on CI's two. A
# file's tests stay in one process (its module fixtures are built once), and each process
# chooses its children's ports from its own share of the range (bench/processes.py).
PYTEST_PROCESSES := -n auto --maxprocesses 2 --dist loadfile

unit: $(STAMP) $(CHROMIUM) $(REDIS_SERVER) $(SS) $(NGINX)
	$(BIN)/pytest -q -m "not vllm" $(PYTEST_PROCESSES)

test: lint typecheck unit

# The benchmark suite (docs/benchmarks.md): not part of `make test` (a smoke run of each scenario
# is: tests/e2e/test_bench_smoke.py). Plots need the bench extra (matplotlib).
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.suite $(BENCH_ARGS)

# The performance suite and the fleet routing study (F) in one run.
bench-all: $(BENCH_STAMP)
	$(BIN)/python -m bench.suite --only overhead,stream_timing,cancellation,scale,slow_clients,fleet

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

bench-fleet: $(BENCH_STAMP)
	$(BIN)/python -m bench.fleet $(BENCH_ARGS)

bench-priority: $(BENCH_STAMP)
	$(BIN)/python -m bench.priority $(BENCH_ARGS)

# C on the real CPU vLLM of the vLLM tier (issue 33; docs/benchmarks.md): needs its venv and
# model (vllm-model, tools/vllm/Makefile.inc) and two cores, one for vLLM.
bench-vllm: $(BENCH_STAMP) vllm-model
	$(BIN)/python -m bench.cancellation_vllm $(BENCH_ARGS)

bench-chunk-path: $(STAMP)
	$(BIN)/python -m bench.chunk_path $(BENCH_ARGS)

MUTATION_STAMP := $(VENV)/.mutation-stamp

$(MUTATION_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

# Mutation testing of the core (docs/testing.md, "Mutation testing"): not part of `make test`.
# mutmut copies the tree into mutants/; a stale copy would test old code, so each target starts
# clean. Two parts, each meant to fit well under 30 minutes on 2 cores: `mutation-core` (the
# request path, the stream decoders, health) and `mutation-providers` (the rest of providers/).
# `make mutation` runs both in one mutmut run (one type check, one collection of statistics).
# tools/mutation/mutmut_main.py is mutmut with three of its fixed costs cut (same decisions).
MUTMUT_RUN = PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tools.mutation.mutmut_main run \
	--max-children $(or $(MUTATION_JOBS),2)
MUTATION_CORE = trio_gateway.dispatch.router. trio_gateway.dispatch.relay. \
	trio_gateway.core.request. trio_gateway.core.toolcalls. trio_gateway.core.sse. trio_gateway.http1. \
	trio_gateway.providers.errors. trio_gateway.fronts.openai_chunks. trio_gateway.capacity.health. \
	trio_gateway.capacity.replica_policy. trio_gateway.providers.toolcall_stop.
# providers/ but the two shared modules counted as core above (their home before the layout).
MUTATION_PROVIDERS = trio_gateway.providers.upstream. trio_gateway.providers.dialect. \
	trio_gateway.providers.translate. trio_gateway.providers.read_timer. \
	trio_gateway.providers.httpx_errors. trio_gateway.providers.credentials. \
	trio_gateway.providers.openai_compatible. trio_gateway.providers.openai. \
	trio_gateway.providers.anthropic. trio_gateway.providers.gemini.
# The money path (issue 29): keys, limits and budgets, their stores, admission, the usage
# ledger and stream, the output caps that bound a request's cost, and the capacity gate.
MUTATION_MONEY = trio_gateway.accounting.limits. trio_gateway.accounting.usage_stream. \
	trio_gateway.accounting.key_store. trio_gateway.accounting.limit_store. \
	trio_gateway.accounting.admission. trio_gateway.accounting.ledger. trio_gateway.core.keys. \
	trio_gateway.core.usage. trio_gateway.providers.output_caps. trio_gateway.capacity.gate. \
	trio_gateway.accounting.spend. trio_gateway.core.budget_period.

mutation: $(MUTATION_STAMP)
	rm -rf mutants
	$(MUTMUT_RUN) $(foreach p,$(MUTATION_CORE) $(MUTATION_PROVIDERS) $(MUTATION_MONEY),"$(p)*")
	$(BIN)/python tools/mutation/report.py

mutation-core: $(MUTATION_STAMP)
	rm -rf mutants
	$(MUTMUT_RUN) $(foreach p,$(MUTATION_CORE),"$(p)*")
	$(BIN)/python tools/mutation/report.py --only $(MUTATION_CORE)

mutation-providers: $(MUTATION_STAMP)
	rm -rf mutants
	$(MUTMUT_RUN) $(foreach p,$(MUTATION_PROVIDERS),"$(p)*")
	$(BIN)/python tools/mutation/report.py --only $(MUTATION_PROVIDERS)

mutation-money: $(MUTATION_STAMP)
	rm -rf mutants
	$(MUTMUT_RUN) $(foreach p,$(MUTATION_MONEY),"$(p)*")
	$(BIN)/python tools/mutation/report.py --only $(MUTATION_MONEY)

# After a run whose survivors are all killed or listed: record the listed equivalents' sources,
# so the next runs skip them while those stay unchanged (tools/mutation/fingerprint.py).
mutation-lock:
	$(BIN)/python tools/mutation/report.py --lock

clean:
	rm -rf dist $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis mutants

-include tools/vllm/Makefile.inc
