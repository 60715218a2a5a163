# `make demo` and `make test` work on a fresh machine: each creates .venv when missing,
# installs the project into it (editable), then runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-all bench golden clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.moons

test: $(STAMP)
	$(PY) -m pytest

test-all: $(STAMP)
	$(PY) -m pytest -m ''

bench: $(STAMP)
	$(PY) bench/shape_scaling.py
	$(PY) -m bench.gemm

golden: $(STAMP)
	$(PY) -m pytest tests --update-golden

clean:
	rm -rf $(VENV) build *.egg-info
