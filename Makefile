# ClusterMedic. Newcomers need two targets: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

BASE_PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
MEDIC := $(BIN)/medic
export PYTHON := $(abspath $(BIN)/python)
# the infra scripts run Python from the project's environment
# pgserver and platformdirs want a runtime dir; give them one instead of a warning per process
export XDG_RUNTIME_DIR ?= /tmp/clustermedic-runtime-$(shell id -u)

.PHONY: help install up down status migrate demo test test-unit test-data test-integration lint lock bench clean

help:
	@echo "make demo   start the local infrastructure and run the smoke flow through Kafka"
	@echo "make test   install, start the infrastructure, run lint and every test, stop what it started"
	@echo "make test-unit   the unit tier alone, under a minute (no infrastructure, no shared data, no slow tests)"
	@echo "other: install up down status migrate test-data test-integration lint lock bench clean"

# One resolver run, frozen in requirements.lock with every distribution's hash (regenerate with
# `make lock`): a package whose file differs from the one locked is refused, not installed.
$(VENV)/.installed: pyproject.toml requirements.lock infra/bootstrap-requirements.txt
	@test -x $(BIN)/python || $(BASE_PYTHON) -m venv $(VENV)
	@# a venv made by uv has no pip: bootstrap it rather than fail
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip >/dev/null
	$(BIN)/python -m pip install -q --require-hashes -r infra/bootstrap-requirements.txt
	$(BIN)/uv pip sync -q --require-hashes --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $@

install: $(VENV)/.installed
	@mkdir -p $(XDG_RUNTIME_DIR) && chmod 700 $(XDG_RUNTIME_DIR)

lock:
	$(BIN)/uv pip compile -q pyproject.toml --extra dev --python-version 3.11 --generate-hashes -o requirements.lock

up: install
	$(MEDIC) up

down:
	@for c in redis postgres kafka; do bash infra/local/$$c.sh stop || true; done

status:
	@for c in kafka postgres redis; do bash infra/local/$$c.sh status || true; done

migrate: install
	$(MEDIC) db migrate

demo: up
	$(MEDIC) demo

lint: install
	$(BIN)/ruff check services pipelines evals tests bench
	@# the cache outlives the clone: checking torch's stubs again costs minutes
	MYPY_CACHE_DIR=$(HOME)/.cache/clustermedic/mypy $(BIN)/mypy

test: install lint
	bash infra/local/with-infra.sh $(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The tiers (docs/testing.md): tests/unit needs no network, infrastructure or ../shared/data and runs in
# under a minute without its `slow` tests; tests/data reads ../shared/data in place; tests/integration and
# tests/acceptance need the infrastructure. `make test` runs them all, slow tests included.
test-unit: install
	$(BIN)/pytest -q -p no:cacheprovider tests/unit -m "not slow" $(PYTEST_ARGS)

test-data: install
	$(BIN)/pytest -q -p no:cacheprovider tests/data $(PYTEST_ARGS)

test-integration: install
	bash infra/local/with-infra.sh $(BIN)/pytest -q -p no:cacheprovider tests/integration tests/acceptance $(PYTEST_ARGS)

bench: install
	bash infra/local/with-infra.sh $(BIN)/python bench/infra.py

clean: down
	rm -rf .run
