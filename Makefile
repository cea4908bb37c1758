# Everything a fresh machine with Python 3.11+ and PyPI access needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Reinstall when the project's metadata changes.
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

run: $(STAMP)
	$(BIN)/xds-relay demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check relay tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.fanout

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "xds-relay needs Python 3.11 or newer as $(PYTHON)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
