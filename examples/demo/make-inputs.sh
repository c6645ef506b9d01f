#!/usr/bin/env bash
# Makes the demo's input directory: a few large files and a thousand small ones, the mix a
# workflow stage typically reads (e.g. SWarp's images plus a catalogue of small files).
# Usage: make-inputs.sh DIR [LARGE_MIB]
set -euo pipefail
dir=${1:?usage: make-inputs.sh DIR [LARGE_MIB]}
large_mib=${2:-64}
mkdir -p "$dir/large" "$dir/small"
for name in alpha beta gamma; do
    # Deterministic content so results can be checked: a seeded stream from openssl-less tools.
    head -c $((large_mib * 1024 * 1024)) </dev/zero | tr '\0' "$(printf '%s' "$name" | head -c1)" >"$dir/large/$name.dat"
done
for i in $(seq -w 0 999); do
    printf 'record %s: the quick brown fox jumps over the lazy dog\n' "$i" >"$dir/small/obj-$i.txt"
done
echo "inputs in $dir: 3 x ${large_mib} MiB + 1000 small files"
