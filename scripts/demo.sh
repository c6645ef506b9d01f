#!/usr/bin/env bash
# The README demo: run the example DataWarp job script on the embedded default.
#   1. make a directory of mixed inputs (3 large files, 1000 small ones) in a work directory,
#   2. `surge run examples/demo/job.sh`: starts a manager and 4 local servers (fast tier in
#      /dev/shm), allocates the job instance, stages the inputs in, mounts it, runs the script,
#      stages the results out, tears everything down,
#   3. checks the results against the inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SURGE=$ROOT/target/release/surge
[ -x "$SURGE" ] || { echo "demo: $SURGE is missing (run: make release)" >&2; exit 1; }
if [ ! -e /dev/fuse ]; then
    echo "demo: /dev/fuse is missing: Surge mounts instances with FUSE" >&2; exit 1
fi
WORK=${SURGE_DEMO_DIR:-/tmp/surge-demo}
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
"$ROOT/examples/demo/make-inputs.sh" demo-inputs 64
echo
echo "\$ surge run examples/demo/job.sh"
"$SURGE" run "$ROOT/examples/demo/job.sh"
echo
# Check the results.
fail=0
for f in demo-inputs/large/*.dat; do
    want=$(sha256sum <"$f" | cut -d' ' -f1)
    got=$(cat "demo-results/$(basename "$f").sha256")
    [ "$want" = "$got" ] || { echo "demo: checksum of $f differs" >&2; fail=1; }
done
cat demo-inputs/large/*.dat | cmp -s - demo-results/combined.dat || { echo "demo: combined.dat differs" >&2; fail=1; }
n=$(ls demo-results/small | wc -l)
[ "$n" -eq 1000 ] || { echo "demo: $n small results instead of 1000" >&2; fail=1; }
[ $fail -eq 0 ] && echo "demo: results in $WORK/demo-results are correct (3 checksums, combined.dat, 1000 transformed files)"
exit $fail
