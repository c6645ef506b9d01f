#!/usr/bin/env bash
# Fuzz Surge's inputs with libFuzzer (cargo fuzz, nightly Rust): the frame and message decoder,
# the #DW/#BB directive parser, the JSON documents users hand in, and `surge sim` system files.
#
#   bench/fuzz.sh [--minutes N] [--jobs J] [TARGET...]     (default: 2 minutes each, every target)
#
# Each target starts from the seeds in fuzz/seeds/<target>/ (in the repository: real frames and
# documents, job scripts with every directive) and the job scripts and system files under
# examples/, and keeps what it learns in fuzz/corpus/<target>/ (not in git). A crash stops the run, leaves the input in
# fuzz/artifacts/<target>/ and prints how to replay it; the script exits non-zero.
# Prints one line per target: runs, coverage, corpus size, result.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

minutes=2
jobs=1
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame directives json_inputs sim_system)

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz.sh: installing the nightly toolchain (cargo fuzz needs it)" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# Seeds: frames and JSON documents made by the example program (regenerated, so they follow
# the formats; committed in seeds/), and the repository's job scripts and system files.
cargo +nightly run --quiet --example seeds
mkdir -p corpus/directives corpus/sim_system
for f in ../examples/demo/job.sh ../examples/tune/*.sh; do
    [ -f "$f" ] && cp "$f" "corpus/directives/example-$(basename "$f")"
done
for f in ../examples/sim/systems/*.toml; do
    [ -f "$f" ] && cp "$f" "corpus/sim_system/"
done

status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="artifacts/$t/last-run.log"
    secs=$((minutes * 60))
    echo "== $t: $minutes minute(s), $jobs job(s)" >&2
    if cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -jobs="$jobs" -workers="$jobs" -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
        result=ok
    else
        result="CRASH (see $log; replay: cargo +nightly fuzz run $t artifacts/$t/<crash-file>)"
        status=1
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    echo "$t: ${runs:-0} runs, coverage ${cov:-?}, corpus $(ls "corpus/$t" | wc -l) inputs: $result"
done
exit $status
