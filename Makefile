# Two commands: `make demo` runs the showcase, `make test` runs the tests. Each creates or
# refreshes the local virtualenv .venv (re-installing when pyproject.toml changes) first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

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
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) experiments/bench_overhead.py --quick --json runs/bench_overhead.json

clean:
	rm -rf $(VENV) runs .pytest_cache
