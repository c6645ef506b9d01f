#!/usr/bin/env bash
# The README demo. Filled in as the data plane and `surge run` land.
set -euo pipefail
cd "$(dirname "$0")/.."
./target/release/surge --help
