# One obvious command for each job. `make test` works on a fresh machine with only Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-integration lint lock proto proto-lint dev bench docs clean

# The dependencies come from the hash-pinned lock (requirements/README.md), the project itself
# without dependencies: two installs from the same commit get the same files.
LOCK := requirements/dev-test.txt

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
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
	$(VENV)/bin/mypy scheduler executor relay shared cli devstack console bench
	$(VENV)/bin/lint-imports

# Refresh requirements/*.txt from pyproject.toml (newest versions within its ranges, with hashes).
PIP_TOOLS_VERSION := 7.7.0
lock: $(STAMP)
	$(PY) -m pip install --quiet 'pip-tools==$(PIP_TOOLS_VERSION)'
	$(PY) requirements/lock.py

proto: $(STAMP)
	$(PY) proto/generate.py
	$(PY) proto/reference.py

# buf (pinned in proto/package.json) lints the module, then checks it against the ref in
# proto/BREAKING_BASELINE (proto/README.md, Versioning). Needs npm; the baseline commit must be fetched.
BUF := proto/node_modules/.bin/buf

$(BUF): proto/package.json proto/package-lock.json
	cd proto && npm ci --no-audit --no-fund
	touch $(BUF)

proto-lint: $(BUF)
	cd proto && node_modules/.bin/buf lint
	cd proto && node_modules/.bin/buf build
	$(BUF) breaking proto --against "$$(proto/baseline-input)"

dev: $(STAMP)
	$(VENV)/bin/agentrt dev

bench: $(STAMP)
	$(PY) -m bench

# The documentation site (mkdocs.yml over docs/), strict: a broken link fails. Open site/index.html.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
