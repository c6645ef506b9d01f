#!/usr/bin/env bash
# Builds the `surge` Python package's wheel (crates/surge-py, with maturin), installs it into a
# virtual environment under target/, and runs its pytest tests against the `surge` binary of
# this tree (built here if needed). `make test` runs this; scripts/setup.sh installs maturin and
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

for tool in "python3 -m maturin --version" "python3 -m pytest --version"; do
    if ! $tool >/dev/null 2>&1; then
        echo "test-python: '${tool% --version}' is missing: run scripts/setup.sh" >&2
        exit 1
    fi
done

# The `surge` binary the tests call. After `cargo test --workspace` (as in `make test`) this
# builds nothing: the same targets with the same features (a `cargo build -p surge-cli`
# resolves the features of one package and rebuilt 15 crates, 2.5 minutes in CI).
$CARGO test --workspace --no-run --quiet
rm -rf target/wheels
# The extension links the system's libmunge (MUNGE authenticates every client of the manager):
# the wheel is for this host, so it is not repaired into a self-contained manylinux one.
python3 -m maturin build --quiet --auditwheel skip -m crates/surge-py/Cargo.toml --out target/wheels
[ -x target/py-venv/bin/python ] || python3 -m venv --system-site-packages target/py-venv
target/py-venv/bin/python -m pip install --quiet --force-reinstall --no-deps target/wheels/*.whl
# From outside the source tree, so `import surge` finds the installed wheel.
cd target
SURGE_BIN="$PWD/debug/surge" py-venv/bin/python -m pytest -q ../crates/surge-py/tests
