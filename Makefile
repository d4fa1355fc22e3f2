# Two set-up commands work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python examples/primitives.py

lint: $(STAMP)
	$(BIN)/ruff check unison tests examples
	$(BIN)/ruff format --check unison tests examples || true

typecheck: $(STAMP)
	$(BIN)/mypy unison

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
