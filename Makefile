# rackflow — `make run` serves a local instance; `make test` runs the whole suite (SQLite and PostgreSQL).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DB ?= sqlite:///rackflow.db
LISTEN ?= 127.0.0.1:50051
export RACKFLOW_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: run test lint typecheck unit proto docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/rackflow db migrate --db $(DB)
	@echo "rackflow listening on $(LISTEN) (database $(DB), simulator backend). Try, in another terminal:"
	@echo "  $(BIN)/rackflow inventory import examples/fleet.yaml"
	@echo "  $(BIN)/rackflow schedule create nightly-reset --cron '*/2 * * * *' --op power-reset --rack rack-01"
	@echo "  $(BIN)/rackflow schedule runs nightly-reset"
	exec $(BIN)/rackflow serve --db $(DB) --listen $(LISTEN)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

test: $(VENV)/.installed-test lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider

unit: $(VENV)/.installed-test
	$(BIN)/pytest -q tests/unit

proto: $(VENV)/.installed-test
	PYTHON=$(BIN)/python scripts/gen_proto.sh

docs: $(VENV)/.installed-test
	$(BIN)/python scripts/gen_api_docs.py

clean:
	rm -rf $(VENV) rackflow.db rackflow.db-wal rackflow.db-shm .pytest_cache .mypy_cache .ruff_cache
