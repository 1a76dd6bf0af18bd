# rackflow — `make run` serves a local instance; `make check` is the fast lane (lint, types, unit tests, the
# SQLite half of the store tests); `make test` runs the whole suite (SQLite and PostgreSQL), as CI does.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DB ?= sqlite:///rackflow.db
LISTEN ?= 127.0.0.1:50051
HTTP_LISTEN ?= 127.0.0.1:8080
export RACKFLOW_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test
# Python keeps what it compiled (__pycache__, gitignored). This machine's environment sets
# PYTHONDONTWRITEBYTECODE=1, under which every `rackflow` process the tests start compiled its ~700 modules
# again: 4.2 s of CPU to a server's "listening" line, against 1.2 s from cached bytecode (docs/PERFORMANCE.md,
# "The suite's time"). An empty value turns the setting off for everything make runs.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: run check test lint typecheck unit proto docs bench clean browser tools screenshots hooks

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The test set is installed by uv, which takes a few seconds of CPU where pip takes 40 (CI installs it on
# every run; docs/PERFORMANCE.md, "The suite's time"), and compiled once there, not by each process.
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/rackflow db migrate --db $(DB)
	@echo "rackflow listening on $(LISTEN) (database $(DB), simulator backend)."
	@echo "Dashboard and JSON API: http://$(HTTP_LISTEN)/"
	@echo "Try, in another terminal:"
	@echo "  $(BIN)/rackflow inventory import examples/fleet.yaml"
	@echo "  $(BIN)/rackflow schedule create nightly-reset --cron '*/2 * * * *' --op power-reset --rack rack-01"
	@echo "  $(BIN)/rackflow schedule runs nightly-reset"
	exec $(BIN)/rackflow serve --db $(DB) --listen $(LISTEN) --http-listen $(HTTP_LISTEN)

# Git hooks that run ruff (check, format) and mypy before each commit, from this venv: nothing to download.
hooks: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	$(BIN)/pre-commit install

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# Much of the suite's time is waiting (real cron minutes, leases, a check's round), so tests run in 4
# workers on 2 cores (3 left the CPU idle through the waits: docs/PERFORMANCE.md, "Four workers"), each
# given a whole module at a time (`--dist loadfile`), so a module's servers, browser pages and fleets are
# made once, not once per worker (docs/PERFORMANCE.md, "The suite at the fortieth stop"); the
# multi-process modules go first, in the order `tests/conftest.py` collects them (xdist would otherwise
# hand out the modules of most tests first, and the minute of faults, one test, last).
test: $(VENV)/.installed-test lint typecheck browser tools
	$(BIN)/pytest -q -p no:cacheprovider -n 4 --dist loadfile --no-loadscope-reorder

# Debian's Chromium and ChromeDriver drive tests/browser; installed here when missing (apt-get, as root or
# through sudo). Nothing downloads a browser at run time. Without them the browser tests skip locally and
# FAIL under CI=true.
CHROMIUM ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@if [ ! -x $(CHROMIUM) ] || [ ! -x $(CHROMEDRIVER) ]; then \
	  echo "installing Debian's chromium and chromium-driver for tests/browser"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends chromium chromium-driver >/dev/null \
	  || echo "warning: could not install chromium (tests/browser will skip, or fail under CI=true)"; \
	fi

# Debian's prometheus (its promtool checks and tests contrib/prometheus/rackflow-alerts.yml) and
# prometheus-alertmanager (the notification tests start an Alertmanager on loopback, and its amtool checks
# docs/NOTIFICATIONS.md's configuration), installed here when missing, as chromium is. Only the binaries
# are used: nothing starts their services. Without them those tests skip locally and FAIL under CI=true.
PROMTOOL ?= /usr/bin/promtool
ALERTMANAGER ?= /usr/bin/prometheus-alertmanager
tools:
	@if [ ! -x $(PROMTOOL) ] || [ ! -x $(ALERTMANAGER) ]; then \
	  echo "installing Debian's prometheus (promtool) and prometheus-alertmanager for the alerting tests"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends prometheus prometheus-alertmanager >/dev/null \
	  || echo "warning: could not install prometheus tools (their tests will skip, or fail under CI=true)"; \
	fi

# PNGs of the main pages of a demo fleet (tests/browser/demo.py), as shown in the README.
screenshots: $(VENV)/.installed-test browser
	$(BIN)/python -m tests.browser.screenshots docs/img

unit: $(VENV)/.installed-test
	$(BIN)/pytest -q tests/unit

# The fast lane, before a commit: ruff, mypy, tests/unit and the SQLite half of tests/store (`-m "not
# postgres"`: no PostgreSQL server, no rackflow processes); CHECK_WORKERS sets the pytest workers. It is
# not CI: `make test` is (the PostgreSQL half, api, web, e2e, faults, …).
CHECK_WORKERS ?= auto
check: $(VENV)/.installed-test lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) -m "not postgres" tests/unit tests/store

# Only the fault-injection tests (database outage, instance crash, clock jump; docs/RELIABILITY.md).
# `make test` runs them too, with everything else.
.PHONY: test-faults
test-faults: $(VENV)/.installed-test
	$(BIN)/pytest -q -p no:cacheprovider tests/faults

# The 10-minute chaos soak (docs/RELIABILITY.md): SEED picks the faults; PG_RESTARTS restarts the soak's
# own PostgreSQL cluster (PG_CLUSTER, serving SOAK_PG; RELIABILITY.md says how to create it) that many
# times. `make test` runs a 1-minute one on the shared server, without restarts.
SEED ?= 1
PG_RESTARTS ?= 1
PG_CLUSTER ?= soak
SOAK_PG ?= postgresql://postgres@127.0.0.1:5433/postgres
.PHONY: soak
soak: $(VENV)/.installed-test
	$(BIN)/python bench/soak.py --minutes 10 --seed $(SEED) --pg-restarts $(PG_RESTARTS) \
		--pg-cluster $(PG_CLUSTER) --pg-admin $(SOAK_PG)

proto: $(VENV)/.installed-test
	PYTHON=$(BIN)/python scripts/gen_proto.sh

docs: $(VENV)/.installed-test
	$(BIN)/python scripts/gen_api_docs.py

# Every benchmark once, at modest sizes (about 8 minutes; needs the PostgreSQL server, see bench/README.md;
# the APScheduler peer makes its own venv from PyPI on first use).
# docs/PERFORMANCE.md lists the full-size commands behind its figures.
bench: $(VENV)/.installed
	$(BIN)/python bench/dispatch_drain.py --db postgres --n 2000
	$(BIN)/python bench/dispatch_drain.py --db postgres --n 2000 --instances 2
	$(BIN)/python bench/dispatch_drain.py --db sqlite --n 2000
	$(BIN)/python bench/dispatch_lag.py --db postgres --samples 40 --n 200
	$(BIN)/python bench/drain_scaling.py --db postgres --small 500 --large 5000
	$(BIN)/python bench/peers/versus_apscheduler3.py --n 1000
	$(BIN)/python bench/fanout.py --db postgres --schedules 10 --racks 100
	$(BIN)/python bench/poll_cost.py --db postgres --small 1000 --large 100000
	$(BIN)/python bench/pause_scan.py --db postgres --sizes 100,1000 --racks 1000 --repeats 10
	$(BIN)/python bench/api.py --db postgres --seconds 5 --schedules 2000
	$(BIN)/python bench/ceiling.py --n 2000
	$(BIN)/python bench/memory.py --db postgres --schedules 20000
	$(BIN)/python bench/http_schedules.py --db postgres --schedules 2000 --loads 20
	$(BIN)/python bench/rollout_step.py --db postgres --racks 300 --max-concurrent 50
	$(BIN)/python bench/idle_cost.py --db both --seconds 30
	$(BIN)/python bench/rack_components.py --racks 2000 --small 100 --big 1000 --repeat 3 --cli-repeat 1

clean:
	rm -rf $(VENV) rackflow.db rackflow.db-wal rackflow.db-shm .pytest_cache .mypy_cache .ruff_cache
