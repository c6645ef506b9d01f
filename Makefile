# The two commands a newcomer types are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
CARGO ?= cargo
SURGE := target/release/surge

.PHONY: setup build release demo test test-rust test-python lint fmt clean

setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --release -p surge-cli

# Set up everything and run the main job on the embedded default.
demo: release
	./scripts/demo.sh

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: setup
	$(CARGO) test --workspace

# The `surge` Python package: wheel built with maturin, pytest tests (scripts/test-python.sh).
test-python: setup
	CARGO=$(CARGO) ./scripts/test-python.sh

# The whole test suite, as CI runs it.
test: lint test-rust test-python

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
