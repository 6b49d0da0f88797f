# Two commands do all setup on a fresh machine: `make demo` and `make test` (the suite, on 2 processes).
# torch is installed first from its CPU build (torch==2.13.0, a local wheel on our machines) and
# pinned by constraints.txt, so that no dependency pulls a CUDA build.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test wheel-check setup clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/arrowstream demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal

# the wheel and sdist: built, checked, the wheel smoke-run in a clean venv (CI runs it after the suite)
wheel-check: $(STAMP)
	$(BIN)/python .ci/wheel_check.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
