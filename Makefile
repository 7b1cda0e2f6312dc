# The README's two commands: `make demo` and `make test` (`make test-fast`: the quick part). Both create .venv if missing and
# install the package with constraints.txt, which pins torch==2.13.0 (never another torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -c constraints.txt
DEMO_DATA ?= data/synthetic-tiny
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dlrmkit synth --preset tiny --out $(DEMO_DATA) --force
	rm -rf runs/demo  # a fresh demo run each time (train refuses another run's log and checkpoints)
	$(VENV)/bin/dlrmkit train --data $(DEMO_DATA) --run-dir runs/demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q

# everything but multi-rank, GPU and slow tests (markers in pyproject.toml): a few minutes on 2 cores
test-fast: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q -m "not slow and not multirank and not gpu"

clean:
	rm -rf $(VENV) data/synthetic-tiny runs
