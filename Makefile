# Self-documenting: `make` alone lists every target with its `## description`.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# DB_PORT: the private cluster's port (default: where it runs or last ran, else 54329).
DEVDB := $(BIN)/python -m service.commands.devdb exec $(if $(DB_PORT),--port $(DB_PORT))

.PHONY: help install test test-unit lint run demo status schema-dump bench bench-quick bench-tools chaos fuzz clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
# setuptools warns on every editable install that a folder named like the package could
# shadow it: that folder is the package.
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[test,dev,otel]'
	@touch $@

install: $(STAMP) ## create .venv with the service and its dependencies
# The dashboard's browser tests drive Debian's chromium (never a downloaded browser). As
# root it is installed from the distro when missing; otherwise those tests are skipped.
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && \
	    apt-get install -y -q chromium >/dev/null; }; }; } || \
	  echo "install: chromium is not installed; the dashboard's browser tests will be skipped (Debian: apt-get install chromium)"

# make test runs the suite in two passes, each test on its own database: first every test
# but the serial ones on TEST_WORKERS processes (pytest-xdist; the longest start first, see
# tests/conftest.py), then the serial ones (they measure time or load) alone. One report
# of service/'s line coverage covers both; PYTEST_ARGS go to both passes. A pass that
# selects no test (exit 5) is no failure unless neither selects one.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest

test: install ## run the whole test suite against a real PostgreSQL, with service/'s coverage
	@rm -f .coverage .coverage.*
	@set +e; \
	echo "make test: the tests that run in parallel, on $(TEST_WORKERS) processes"; \
	$(DEVDB) --shared-ok -- $(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m 'not serial' \
	  --cov --cov-report= $(PYTEST_ARGS); parallel=$$?; \
	echo "make test: the serial tests, alone"; \
	$(DEVDB) --shared-ok -- $(PYTEST) -m serial --cov --cov-append --cov-report=term \
	  $(PYTEST_ARGS); serial=$$?; \
	for rc in $$parallel $$serial; do [ $$rc = 0 ] || [ $$rc = 5 ] || exit $$rc; done; \
	[ "$$parallel$$serial" != 55 ] || exit 5

# Collects tests/unit alone (the other folders' imports take longer than its tests) unless
# PYTEST_ARGS names what to run.
test-unit: install ## the unit tests only: fast, no database needed
	$(PYTEST) -m unit $(if $(filter tests%,$(PYTEST_ARGS)),,tests/unit) $(PYTEST_ARGS)

lint: install ## ruff, mypy and import-linter (the layers of service/)
	$(BIN)/ruff check service tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

run: install ## migrate, load the demo schema, print a token, serve the API and a worker (PORT=8000 DB_PORT=54329)
	WEBHOOKS_ALLOW_PRIVATE_TARGETS=$${WEBHOOKS_ALLOW_PRIVATE_TARGETS:-true} \
	  $(DEVDB) -- $(BIN)/webhooks dev $(if $(PORT),--port $(PORT))

demo: install ## subscribe a local receiver and watch signed deliveries (with `make run` going)
	$(DEVDB) -- $(BIN)/webhooks demo $(if $(API),--api $(API))

status: install ## what the service is doing, at a glance
	$(DEVDB) -- $(BIN)/webhooks status

schema-dump: install ## write tests/schema.dump.sql again (after a new migration or a change to sql/)
	$(DEVDB) --shared-ok -- $(BIN)/python -m tests.support.schema

bench: install bench-tools ## the benchmark suite against a private database: one table, bench/results.json
	$(DEVDB) -- $(BIN)/python -m bench.run $(BENCH_ARGS)

bench-quick: install bench-tools ## a short benchmark run (under two minutes)
	$(DEVDB) -- $(BIN)/python -m bench.run --quick $(BENCH_ARGS)

# pgbench drives the capture scenario; wrk the API one (without it, a Python load
# generator stands in and the table says so). As root, wrk is installed from the distro.
bench-tools:
	@command -v pgbench >/dev/null || { echo "bench: pgbench is needed (Debian: postgresql-client)"; exit 1; }
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q wrk >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; }; }; } || \
	  echo "bench: wrk is not installed; the API scenario uses its Python load generator"

chaos: install ## kill workers, restart Postgres, cut LISTEN, hang connections: prove nothing is lost (own cluster)
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

fuzz: install ## schemathesis against the API's OpenAPI document, long run (FUZZ_EXAMPLES=300)
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-300} $(DEVDB) --shared-ok -- \
	  $(BIN)/python -m pytest tests/db/test_fuzz.py -s $(PYTEST_ARGS)

clean: ## remove the virtualenv and caches (keeps .pgdata)
	rm -rf $(VENV) .pgdata-chaos .pytest_cache .mypy_cache .ruff_cache
