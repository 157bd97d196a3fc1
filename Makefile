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

# Three test processes on two cores (pytest-xdist): the launched tests wait on their workers, and a
# third process keeps both cores busy meanwhile (BUILD_NOTES, "Tests"). The tests that launch
# workers run one at a time in one of them (tests/conftest.py). `$(PY) -m pytest tests/test_x.py`
# runs a file alone.
test: $(STAMP)
	$(PY) -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) -m experiments.bench_overhead --quick --json runs/bench_overhead.json

# The GPU check (issue 27, experiments/gpu_check.py) on a lent GPU machine, whose Python already
# has JAX with CUDA and most of hetjax's dependencies: nothing is installed from the network.
# What it lacks (pytest and pytest-timeout for its exactness tests, tokenizers, tensorboardX,
# safetensors) travels as wheels: `make gpu-wheels` where a package registry is reachable, then
# carry wheels/.
GPU_WHEELS := 'pytest<9.2' pytest-timeout tokenizers tensorboardX safetensors

gpu-check:
	@if [ -d wheels ]; then $(PYTHON) -m pip install --quiet --no-index --find-links wheels \
	  $(GPU_WHEELS); fi
	$(PYTHON) -m pip install --quiet --no-deps --no-index --find-links wheels -e .
	$(PYTHON) -m experiments.gpu_check --platform=gpu --out=runs/gpu_check

# setuptools is what pip builds hetjax's editable install with, offline (the models' folder is
# mapped to hetjax.models by pyproject.toml's package-dir, so PYTHONPATH=. alone does not do).
gpu-wheels:
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version 3.12 --dest wheels \
	  $(GPU_WHEELS) 'setuptools>=77'

clean:
	rm -rf $(VENV) runs .pytest_cache
