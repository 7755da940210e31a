# lshdist: two commands.  `make test` and `make demo` set everything up from plain Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SHARED_DATA := $(abspath ../shared/datasets)
# the real datasets, when the shared folder exists beside this checkout
ifneq ($(wildcard $(SHARED_DATA)),)
export LSHDIST_DATA_DIR ?= $(SHARED_DATA)
endif
DEMO := out/demo

.PHONY: test lint types test-slow test-slurm demo bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/.test
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

$(VENV)/.bench: pyproject.toml $(VENV)/.test
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

## lint, types, then the default test run (tests marked slow, cluster or drills excluded)
test: lint types $(VENV)/.test
	$(BIN)/pytest

lint: $(VENV)/.test
	$(BIN)/ruff check lshdist tests benchmarks scripts jobs
	$(BIN)/lint-imports

types: $(VENV)/.test
	$(BIN)/mypy

## the tests marked slow, cluster or drills (CI runs them after `make test`)
test-slow: $(VENV)/.test
	$(BIN)/pytest -m "slow or cluster or drills"

## the tests marked slurm: a one-node SLURM (deploy/slurm/local-cluster.sh, as root) and real
## submissions to it; a SLURM that cannot be brought up fails the run instead of skipping
test-slurm: $(VENV)/.test
	LSHDIST_REQUIRE_SLURM=1 $(BIN)/pytest -m slurm tests/deploy

## ingest the real datasets and evaluate the learned metric + hashing on them
demo: $(VENV)/.test
	bash scripts/demo.sh $(DEMO)

## comparisons with metric-learn, FAISS and hnswlib (results in benchmarks/results/)
bench: $(VENV)/.bench
	$(BIN)/python benchmarks/bench_itml.py
	$(BIN)/python benchmarks/bench_fashion.py

## the documentation site into site/ (MkDocs; warnings are errors; the CLI reference is
## generated from the parser, the API reference from the docstrings)
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) out site .pytest_cache .hypothesis
