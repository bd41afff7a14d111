# `make test` and `make demo` each build .venv from nothing, install what they need, and run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test,ray]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(VENV)/bin/bugfix-gym train

bench: $(STAMP)
	$(PY) benchmarks/env_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
