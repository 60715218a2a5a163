# `make demo` and `make test` work on a fresh machine: each creates .venv when missing,
# installs the project into it (editable), then runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev-triton
# The demo's pictures (loss curve, decision boundary, progress bar) come from the plot extra.
DEMO_STAMP := $(VENV)/.installed-plot
# The benchmarks' peers (PyTorch, JAX) come from the peers extra.
BENCH_STAMP := $(VENV)/.installed-peers

# The triton extra (triton, torch) is part of the test install, and so is the examples extra
# (scikit-learn, whose bundled digits the digits example's tests train on). Without a GPU, torch
# is pinned to its CPU build (constraints-cpu.txt) and Triton's tests run in its CPU interpreter
# (TRITON_INTERPRET=1, which Context.auto() never picks); with one, pip takes the CUDA build.
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifneq ($(GPU),yes)
export TRITON_INTERPRET := 1
endif

.PHONY: demo test test-all bench bench-triton golden clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints-cpu.txt examples/numpy_loops/pyproject.toml
ifeq ($(GPU),yes)
	$(PY) -m pip install --quiet -e '.[dev,triton,examples]'
else
	# The CPU torch build where the configured indexes or wheel folders have it; without it the
	# Triton tests skip (they say why) and everything else runs.
	$(PY) -m pip install --quiet -e '.[dev,triton,examples]' -c constraints-cpu.txt \
	  || { echo "note: no CPU build of torch to install here: the Triton tests will skip"; \
	       $(PY) -m pip install --quiet -e '.[dev,examples]'; }
endif
	# The example backend of docs/backends.md, found through its entry point by the kit's tests.
	$(PY) -m pip install --quiet --no-deps -e examples/numpy_loops
	touch $(STAMP)

$(DEMO_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[plot]'
	touch $(DEMO_STAMP)

$(BENCH_STAMP): $(STAMP)
ifeq ($(GPU),yes)
	$(PY) -m pip install --quiet -e '.[peers]'
else
	$(PY) -m pip install --quiet -e '.[peers]' -c constraints-cpu.txt
endif
	touch $(BENCH_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m examples.moons

test: $(STAMP)
	$(PY) -m pytest

test-all: $(STAMP)
	$(PY) -m pytest -m ''

bench: $(BENCH_STAMP)
	$(PY) bench/shape_scaling.py
	$(PY) -m bench.gemm
	$(PY) -m bench.cpu_steps

bench-triton: $(STAMP)
	$(PY) -m bench.triton_gpu

golden: $(STAMP)
	$(PY) -m pytest tests --update-golden

clean:
	rm -rf $(VENV) build *.egg-info
