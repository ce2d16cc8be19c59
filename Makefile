# Every target installs what it needs into .venv first (a fresh machine needs only python3).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest processes (pytest-xdist); every test file runs whole in one of them, so module
# fixtures are set up once, and session fixtures (the Prefect server) once per process.
# 3 on 2 cores: 4 were faster beside a 2-process CPU hog (14-16 min instead of 19-21), but
# there the load made classifier tests misread (docs/measured-figures.md)
PYTEST_WORKERS ?= 3
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: install test test-fast lint docs demo stop bench clean

# Each module's bytecode is written when a process first imports it, whatever the machine
# says: with PYTHONDONTWRITEBYTECODE=1 (as on the machine this was measured on) and nothing
# compiled, every process, each Dask worker too, compiled every module it imported, and the
# suite took 40 % longer. The install compiles nothing ahead (most of the 15,000 modules are
# never imported): uv installs the pinned set in about 8 s, where pip took about a minute.
export PYTHONDONTWRITEBYTECODE :=

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	$(PY) -m uv pip install --python $(PY) -q -c constraints.txt -e '.[test,dev,docs,raster]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(PY) -m ruff check prefect_dask_profiling flows tasks tests benchmarks
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) -m pytest -q -ra --durations=40 $(XDIST) $(PYTEST_ARGS) tests

# the fast tier while developing: no Prefect server, no process clusters, no SeaweedFS or
# netns (pytest -m "not slow", tests/helpers/tiers.py); make test (CI) runs everything
test-fast: $(STAMP)
	$(PY) -m ruff check prefect_dask_profiling flows tasks tests benchmarks
	$(PY) -m pytest -q -ra -m "not slow" --durations=20 $(XDIST) $(PYTEST_ARGS) tests

lint: $(STAMP)
	$(PY) -m ruff check prefect_dask_profiling flows tasks tests benchmarks

# the docs site (mkdocs.yml, pages in docs/), strict: a broken link or a stale API name fails
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

demo: $(STAMP)
	$(PY) -m flows.demo

stop: $(STAMP)
	$(PY) -m flows.demo --stop

bench: $(STAMP)
	$(PY) benchmarks/plugin_overhead.py

clean:
	rm -rf $(VENV) .dask-profiling .demo site
