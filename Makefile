# The README's two commands: `make demo` and `make test`. Both create .venv if missing and
# install the package with constraints.txt, which pins torch==2.13.0 (never another torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -c constraints.txt
DEMO_DATA ?= data/synthetic-tiny
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

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

clean:
	rm -rf $(VENV) data/synthetic-tiny runs
