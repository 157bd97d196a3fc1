# Two commands: `make demo` runs the showcase, `make test` runs the tests. Each creates or
# refreshes the local virtualenv .venv (re-installing when pyproject.toml changes) first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean gpu-check gpu-wheels

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "hetjax needs Python >= 3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) experiments/demo.py --workdir=runs/demo

# Two test processes (pytest-xdist); the tests that launch workers run one at a time in one of
# them (tests/conftest.py). `$(PY) -m pytest tests/test_x.py` runs a file alone.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) experiments/bench_overhead.py --quick --json runs/bench_overhead.json

# The GPU check (issue 27, experiments/gpu_check.py) on a lent GPU machine, whose Python already
# has JAX with CUDA and most of hetjax's dependencies: nothing is installed from the network.
# What it lacks (pytest and pytest-timeout for its exactness tests, tokenizers, tensorboardX)
# travels as wheels: `make gpu-wheels` where a package registry is reachable, then carry wheels/.
GPU_WHEELS := 'pytest<9.2' pytest-timeout tokenizers tensorboardX

gpu-check:
	@if [ -d wheels ]; then $(PYTHON) -m pip install --quiet --no-index --find-links wheels \
	  $(GPU_WHEELS); fi
	PYTHONPATH=. $(PYTHON) experiments/gpu_check.py --platform=gpu --out=runs/gpu_check

gpu-wheels:
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version 3.12 --dest wheels \
	  $(GPU_WHEELS)

clean:
	rm -rf $(VENV) runs .pytest_cache
