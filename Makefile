# One obvious command for each job. `make test` works on a fresh machine with only Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-integration lint proto dev bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy scheduler executor relay shared devstack bench
	$(VENV)/bin/lint-imports

proto: $(STAMP)
	$(PY) proto/generate.py

dev: $(STAMP)
	$(VENV)/bin/agentrt dev

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
