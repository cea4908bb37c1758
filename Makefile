# Everything a fresh machine with Python 3.11+ and PyPI access needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Reinstall when the project's metadata changes: the relay's own dependencies
# for run, and with them the test and lint tools for the rest.
RUN_STAMP := $(VENV)/.installed-run
STAMP     := $(VENV)/.installed
# gRPC's Node.js xDS client, a second real client for the interop tests;
# skipped (and its test with it) where npm is missing.
NODE_DIR   := tests/interop/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
# Debian's chromium, the browser of the console's tests (tests/console, driven
# by Playwright, never a downloaded browser); installed where apt-get may be
# run (as root, or with sudo -n), else those tests skip, saying so.
CHROMIUM   := /usr/bin/chromium

.PHONY: run test lint bench clean

run: $(RUN_STAMP)
	$(BIN)/xds-relay demo

# The suite runs on two processes (pytest-xdist), a test file to each at a time
# so a file's module fixtures start once: on a 2-core machine that halves its
# time (about 140 s against 280). `make test WORKERS=0` runs it in one process.
WORKERS ?= 2

test: $(STAMP) $(NODE_STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -q $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

lint: $(STAMP)
	$(BIN)/ruff check relay tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.fanout

# Flame graphs (py-spy) of the relay under the fan-out and big-client loads:
# benchmarks/results/profile-*.svg and profile.md (benchmarks/profile.py).
PROFILE_STAMP := $(VENV)/.installed-profile
.PHONY: profile
profile: $(PROFILE_STAMP)
	$(BIN)/python -m benchmarks.profile

$(PROFILE_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[profile]'
	touch $(PROFILE_STAMP)

$(RUN_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "xds-relay needs Python 3.11 or newer as $(PYTHON)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(CHROMIUM):
	@if ! command -v apt-get >/dev/null 2>&1; then \
		echo "no apt-get: the console's browser tests will be skipped"; \
	elif [ "$$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then \
		echo "not root and no sudo: the console's browser tests will be skipped"; \
	else \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		echo "installing chromium (Debian) for the console's browser tests"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium >/dev/null 2>&1 || \
			echo "could not install chromium: the console's browser tests will be skipped"; \
	fi

$(NODE_STAMP): $(NODE_DIR)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(NODE_DIR) --ignore-scripts --no-audit --no-fund --loglevel=error && \
		touch $(NODE_STAMP); \
	else echo "npm not found: the Node.js xDS interop test will be skipped"; fi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache $(NODE_DIR)/node_modules

# The documentation's generated parts: the pictures in docs/diagrams/, rendered
# from their Graphviz sources (needs dot: apt-get install graphviz), the
# configuration reference and the example config, from relay/config/.
# tests/docs fails when a committed one is not what these make.
.PHONY: diagrams docs
diagrams:
	$(PYTHON) docs/diagrams/render.py

docs: $(RUN_STAMP) diagrams
	$(BIN)/python -m relay.config.reference > docs/configuration.md
	$(BIN)/python -m relay.config.reference --example > config/example.yaml
