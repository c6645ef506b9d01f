#!/usr/bin/env bash
# Reproduces Liu et al.'s experiments (MSST 2012, §IV) with `surge sim` and writes tables
# (Markdown, CSV, JSON) and SVG figures under examples/sim/results/<experiment>/.
#
#   examples/sim/reproduce.sh                 # everything at the paper's scale (~5 min)
#   examples/sim/reproduce.sh fig3            # one experiment: fig3, fig4a, fig4b, multiapp
#   examples/sim/reproduce.sh all 0.0625      # everything at 1/16 scale (seconds)
#
# The experiments use the system and kernel files in this directory (systems/, kernels/);
# edit them and re-run to see what a different machine or workload does.
set -euo pipefail
cd "$(dirname "$0")/../.."

what=${1:-all}
scale=${2:-1}
SURGE=${SURGE:-${CARGO_TARGET_DIR:-target}/release/surge}
if [ ! -x "$SURGE" ]; then
    echo "building $SURGE (cargo build --release -p surge-cli)" >&2
    cargo build --release -q -p surge-cli
fi
out=examples/sim/results
[ "$scale" = 1 ] || out="$out-scale-$scale"
"$SURGE" sim experiment "$what" --scale "$scale" --examples examples/sim --out "$out"
echo "results in $out/" >&2
