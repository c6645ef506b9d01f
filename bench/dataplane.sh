#!/usr/bin/env bash
# Data-plane benchmark (issue 2): the Surge mount against, in the same run,
#   raw  - the fast-tier directory itself (/dev/shm), the limit;
#   pll  - libfuse's passthrough_ll over a /dev/shm directory, the price any FUSE design pays;
#   plld - the same with -o default_permissions (metadata tests only): the kernel checks
#          permissions, as on a Surge mount, which costs a getattr round trip after every change
#          of a directory;
#   surge1 - a one-fragment Surge instance on a local server (the local fast path: kernel FUSE
#            passthrough, DESIGN §3);
#   surgeN - a Surge instance striped over N local servers, mounted with --layout stripe_count=all
#            (DataWarp's striping over every fragment: every byte through the daemon);
#   surgeP - (metadata tests only) a one-fragment instance in private mode (DataWarp's per-node
#            namespace), where creates as well as unlinks are answered before the metadata
#            server makes them (docs/DATAPLANE.md).
# Fast tier of the servers: /dev/shm.
# Tests: sequential 8 MiB write bandwidth (seqwrite: fio's default, the file preallocated with
# fallocate before timing; seqwritenp: --fallocate=none, page allocation timed too), sequential
# read bandwidth, 4 KiB random read and write IOPS (fio, psync), at 1 and 2 streams; file create, stat and unlink rates (bench/md.c, 10k files per
# process). Each test is run REPS times and the median kept. Prints a table of medians and the
# ratios surge/raw, pll/raw and surge/pll.
#
# Usage: bench/dataplane.sh [--reps N] [--servers N] [--size MiB] [--files N] [--runtime S] [--json FILE]
#                           [--md-only]   (only the metadata tests)
#                           [--tls]   (instead of the targets above: TLS against clear text, both
#                                      a one-fragment instance on a local server reached over
#                                      loopback TCP, no Unix socket: "tcp" (server --tls off)
#                                      and "tls" (server --tls on, a certificate of a CA made
#                                      for the run, the mount verifying it); their order
#                                      alternates per rep; prints tls/tcp per test)
#                           [--halt-poll-ns NS]  (a KVM guest with the haltpoll cpuidle driver: poll
#                                          NS before halting an idle vCPU during the run, restored
#                                          after; the metadata rows are bound by cross-vCPU wake-ups,
#                                          which cost a VM exit each when the guest halts at once)
# SURGE=path/to/surge picks the binary (default target/release/surge), e.g. one built from an
# older commit to compare two versions in alternating runs. The servers get a cluster key made
# for the run (SURGE_KEY_FILE).
# Needs root (FUSE mounts, dropping caches), fio, gcc and libfuse3-dev (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=3 SERVERS=2 SIZE_MB=1024 FILES=10000 RUNTIME=5 JSON="" MD_ONLY=0 HALT_POLL="" TLS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --size) SIZE_MB=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        --md-only) MD_ONLY=1; shift ;;
        --tls) TLS=1; shift ;;
        --halt-poll-ns) HALT_POLL=$2; shift 2 ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "dataplane.sh: needs root (FUSE mounts)" >&2; exit 1; }
for c in fio gcc pkg-config; do command -v $c >/dev/null || { echo "missing $c: run scripts/setup.sh" >&2; exit 1; }; done

# How an idle vCPU waits (a KVM guest's haltpoll driver): printed with the results, since the
# metadata rows depend on it (docs/DATAPLANE.md).
HP=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HALT_POLL_WAS=$(cat "$HP" 2>/dev/null || echo -)
[ -z "$HALT_POLL" ] || [ -w "$HP" ] || {
    echo "dataplane.sh: --halt-poll-ns: $HP is not there (not a KVM guest with the haltpoll cpuidle driver)" >&2; exit 2; }

SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
WORK=$(mktemp -d /tmp/surge-dataplane.XXXXXX)
# The servers' cluster key (32 random bytes, 0600); the commands below make capabilities with it.
(umask 077; head -c 32 /dev/urandom >"$WORK/surge.key")
export SURGE_KEY_FILE="$WORK/surge.key"
SHM=/dev/shm/surge-dataplane-$$
mkdir -p "$SHM" "$WORK/bin"
PIDS=()
MOUNTS=()
cleanup() {
    set +e
    for m in "${MOUNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$SHM" "$WORK"
    [ -z "$HALT_POLL" ] || echo "$HALT_POLL_WAS" >"$HP"
}
trap cleanup EXIT INT TERM
[ -z "$HALT_POLL" ] || echo "$HALT_POLL" >"$HP"
HALT_POLL_NOW=$(cat "$HP" 2>/dev/null || echo -)
echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo -), guest_halt_poll_ns $HALT_POLL_NOW" >&2

gcc -O2 -o "$WORK/bin/md" bench/md.c
gcc -O2 -Wall -o "$WORK/bin/passthrough_ll" /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c \
    $(pkg-config --cflags --libs fuse3) -lpthread 2>"$WORK/pll-build.log" || {
    echo "cannot build passthrough_ll (see $WORK/pll-build.log)" >&2; cat "$WORK/pll-build.log" >&2; exit 1; }

# --- targets ---
mkdir -p "$SHM/raw" "$SHM/pll-src" "$SHM/plld-src" "$WORK/pll" "$WORK/plld" "$WORK/surge"
"$WORK/bin/passthrough_ll" -o source="$SHM/pll-src" "$WORK/pll" &
PIDS+=($!); MOUNTS+=("$WORK/pll")
"$WORK/bin/passthrough_ll" -o source="$SHM/plld-src",default_permissions "$WORK/plld" &
PIDS+=($!); MOUNTS+=("$WORK/plld")
ADDRS=()
for i in $(seq 1 "$SERVERS"); do
    $SURGE server --device "$SHM/bb$i" --capacity 16GiB --listen 127.0.0.1:0 --unix "$SHM/bb$i.sock" \
        --ready-file "$WORK/bb$i.ready" 2>"$WORK/bb$i.log" &
    PIDS+=($!)
done
for i in $(seq 1 "$SERVERS"); do
    for _ in $(seq 100); do [ -s "$WORK/bb$i.ready" ] && break; sleep 0.05; done
    ADDRS+=("$(python3 -c 'import json,sys; print([a for a in json.load(open(sys.argv[1]))["addrs"] if not a.startswith("unix:")][0])' "$WORK/bb$i.ready")")
done
mkid() { python3 -c 'import json,sys; print(json.load(sys.stdin)["instance"])'; }
ID1=$($SURGE instance create --servers "${ADDRS[0]}" --capacity 8GiB --json | mkid)
IDN=$($SURGE instance create --servers "$(IFS=,; echo "${ADDRS[*]}")" --capacity 8GiB --json | mkid)
IDP=$($SURGE instance create --servers "${ADDRS[0]}" --capacity 2GiB --access-mode private --json | mkid)
mkdir -p "$WORK/surge1" "$WORK/surgeN" "$WORK/surgeP"
for t in 1:$ID1 N:$IDN P:$IDP; do
    extra=(); [ "${t%%:*}" = N ] && extra=(--layout stripe_count=all)
    $SURGE mount "${extra[@]}" --server "${ADDRS[0]}" --instance "${t#*:}" --ready-file "$WORK/mnt${t%%:*}.ready" "$WORK/surge${t%%:*}" 2>"$WORK/mount${t%%:*}.log" &
    PIDS+=($!); MOUNTS+=("$WORK/surge${t%%:*}")
done
for _ in $(seq 100); do [ -s "$WORK/mnt1.ready" ] && [ -s "$WORK/mntN.ready" ] && [ -s "$WORK/mntP.ready" ] && mountpoint -q "$WORK/pll" && break; sleep 0.05; done
for m in surge1 surgeN surgeP pll plld; do mountpoint -q "$WORK/$m" || { echo "$m mount failed"; cat "$WORK"/mount*.log; exit 1; }; done

declare -A DIR=([raw]="$SHM/raw" [pll]="$WORK/pll" [plld]="$WORK/plld" [surge1]="$WORK/surge1" [surgeN]="$WORK/surgeN" [surgeP]="$WORK/surgeP")
TARGETS=(raw pll surge1 surgeN)
MD_TARGETS=(raw pll plld surge1 surgeN surgeP)
if [ "$TLS" -eq 1 ]; then
    # TLS against clear text on the same path: a one-fragment instance on a local server over
    # loopback TCP (no Unix socket, which is never encrypted), the server in --tls off / on.
    "$SURGE" cert ca --dir "$WORK/tls" >/dev/null
    "$SURGE" cert server 127.0.0.1 --ca-cert "$WORK/tls/ca.crt" --out "$WORK/tls" >/dev/null
    for m in tcp:off tls:on; do
        t=${m%%:*}
        $SURGE server --device "$SHM/bb-$t" --capacity 16GiB --listen 127.0.0.1:0 --tls "${m#*:}" \
            --tls-cert "$WORK/tls/server.crt" --ready-file "$WORK/bb-$t.ready" 2>"$WORK/bb-$t.log" &
        PIDS+=($!)
        for _ in $(seq 100); do [ -s "$WORK/bb-$t.ready" ] && break; sleep 0.05; done
        a=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["addrs"][0])' "$WORK/bb-$t.ready")
        id=$(SURGE_TLS=${m#*:} SURGE_TLS_CA="$WORK/tls/ca.crt" $SURGE instance create --servers "$a" --capacity 8GiB --json | mkid)
        mkdir -p "$WORK/$t"
        SURGE_TLS=${m#*:} SURGE_TLS_CA="$WORK/tls/ca.crt" $SURGE mount --server "$a" --instance "$id" \
            --ready-file "$WORK/mnt-$t.ready" "$WORK/$t" 2>"$WORK/mount-$t.log" &
        PIDS+=($!); MOUNTS+=("$WORK/$t")
        for _ in $(seq 100); do [ -s "$WORK/mnt-$t.ready" ] && break; sleep 0.05; done
        mountpoint -q "$WORK/$t" || { echo "$t mount failed"; cat "$WORK/mount-$t.log"; exit 1; }
        DIR[$t]="$WORK/$t"
    done
    grep -h "TLS" "$WORK"/bb-t*.log | head -2 >&2 || true
    TARGETS=(tcp tls)
    MD_TARGETS=(tcp tls)
fi

# fio_run TARGET NAME RW BS JOBS -> prints MiB/s (bw tests) or IOPS
fio_run() {
    local t=$1 name=$2 rw=$3 bs=$4 jobs=$5 dir=${DIR[$1]}
    local per=$((SIZE_MB / jobs))
    local out="$WORK/fio-$t-$name.json"
    local extra=()
    case $rw in
        write) extra=(--size="${per}M") ;;
        # fio preallocates a file it writes (fallocate) before timing; "writenp" turns that
        # off, so the run also pays for allocating the pages (what dd or cp see).
        writenp) rw=write; extra=(--size="${per}M" --fallocate=none) ;;
        read) extra=(--size="${per}M") ;;
        randread|randwrite) extra=(--size=256M --time_based --runtime="$RUNTIME") ;;
    esac
    # Reads: lay the files out first, then drop caches so they are read from the target.
    if [ "$rw" = read ] || [ "$rw" = randread ] || [ "$rw" = randwrite ]; then
        fio --name=lay --directory="$dir" --rw=write --bs=1M --numjobs="$jobs" --filename_format='f.$jobnum' \
            "${extra[@]}" --time_based=0 --runtime=0 --output-format=json >/dev/null
        sync; echo 3 >/proc/sys/vm/drop_caches
    fi
    fio --name="$name" --directory="$dir" --rw="$rw" --bs="$bs" --numjobs="$jobs" --ioengine=psync \
        --filename_format='f.$jobnum' --group_reporting --output-format=json "${extra[@]}" >"$out"
    rm -f "$dir"/f.*
    case $rw in
        write|read) python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f" % ((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/1048576))' "$out" ;;
        *) python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f" % (j["read"]["iops"]+j["write"]["iops"]))' "$out" ;;
    esac
}

md_run() { # TARGET PROCS -> "create stat unlink"
    "$WORK/bin/md" "${DIR[$1]}" "$((FILES / $2))" "$2" | awk '{printf "%s ", $2}'
}

TESTS=("seqwrite-1:write:8M:1" "seqwrite-2:write:8M:2" "seqwritenp-1:writenp:8M:1" "seqwritenp-2:writenp:8M:2" "seqread-1:read:8M:1" "seqread-2:read:8M:2"
       "randread4k-1:randread:4k:1" "randread4k-2:randread:4k:2" "randwrite4k-1:randwrite:4k:1" "randwrite4k-2:randwrite:4k:2")
declare -A R
[ "$MD_ONLY" -eq 0 ] || TESTS=()
# Warm up: first writes to fresh memory are slow on this VM.
[ "$MD_ONLY" -eq 1 ] || for t in "${TARGETS[@]}"; do fio_run "$t" warm write 8M 1 >/dev/null; done
for rep in $(seq 1 "$REPS"); do
    if [ "$TLS" -eq 1 ]; then
        # Sides alternate their order per rep.
        if [ $((rep % 2)) -eq 1 ]; then TARGETS=(tcp tls); else TARGETS=(tls tcp); fi
        MD_TARGETS=("${TARGETS[@]}")
    fi
    for spec in ${TESTS[@]+"${TESTS[@]}"}; do
        IFS=: read -r name rw bs jobs <<<"$spec"
        for t in "${TARGETS[@]}"; do
            v=$(fio_run "$t" "$name" "$rw" "$bs" "$jobs")
            R[$t,$name]="${R[$t,$name]:-} $v"
        done
        echo "rep $rep $name: $(for t in "${TARGETS[@]}"; do printf '%s %s ' "$t" "${R[$t,$name]##* }"; done)" >&2
    done
    for procs in 1 2; do
        for t in "${MD_TARGETS[@]}"; do
            read -r c s u <<<"$(md_run "$t" "$procs")"
            R[$t,create-$procs]="${R[$t,create-$procs]:-} $c"
            R[$t,stat-$procs]="${R[$t,stat-$procs]:-} $s"
            R[$t,unlink-$procs]="${R[$t,unlink-$procs]:-} $u"
        done
        echo "rep $rep metadata-$procs (create/stat/unlink):" \
             "$(for t in "${MD_TARGETS[@]}"; do printf '%s %s/%s/%s ' "$t" "${R[$t,create-$procs]##* }" "${R[$t,stat-$procs]##* }" "${R[$t,unlink-$procs]##* }"; done)" >&2
    done
done

median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ROWS=(seqwrite-1 seqwrite-2 seqwritenp-1 seqwritenp-2 seqread-1 seqread-2 randread4k-1 randread4k-2 randwrite4k-1 randwrite4k-2
      create-1 create-2 stat-1 stat-2 unlink-1 unlink-2)
[ "$MD_ONLY" -eq 0 ] || ROWS=(create-1 create-2 stat-1 stat-2 unlink-1 unlink-2)
ratio() { echo "$1 $2" | awk '{ if ($1 == "-" || $2 == "-" || $2 <= 0) print "-"; else printf "%.2f", $1 / $2 }'; }
if [ "$TLS" -eq 1 ]; then
    printf '\nTLS against clear text over loopback TCP, medians of %s reps (per rep tls/tcp)\n' "$REPS"
    printf '%-15s %9s %9s %8s   %s\n' test tcp tls tls/tcp "per rep"
    for row in "${ROWS[@]}"; do
        c=$(echo "${R[tcp,$row]}" | median); t=$(echo "${R[tls,$row]}" | median)
        read -ra cs <<<"${R[tcp,$row]}"; read -ra ts <<<"${R[tls,$row]}"
        per=""; for i in "${!cs[@]}"; do per+="$(ratio "${ts[$i]}" "${cs[$i]}") "; done
        printf '%-15s %9s %9s %8s   %s %s\n' "$row" "$c" "$t" "$(ratio "$t" "$c")" "$per" \
            "$([[ $row == seq* ]] && echo MiB/s || echo ops/s)"
    done
    exit 0
fi
printf '\n%-15s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' test raw pll plld surge1 surgeN surgeP s1/raw sN/raw pll/raw s1/pll sN/pll sP/pll s1/plld sN/plld sP/plld
JS="{\"servers\": $SERVERS, \"reps\": $REPS, \"guest_halt_poll_ns\": \"$HALT_POLL_NOW\", \"results\": {"
first=1
ratio() { echo "$1 $2" | awk '{ if ($1 == "-" || $2 == "-" || $2 <= 0) print "-"; else printf "%.2f", $1 / $2 }'; }
for row in "${ROWS[@]}"; do
    raw=$(echo "${R[raw,$row]}" | median); pll=$(echo "${R[pll,$row]}" | median)
    plld=$(echo "${R[plld,$row]:-}" | median); plld=${plld:--}
    sp=$(echo "${R[surgeP,$row]:-}" | median); sp=${sp:--}
    s1=$(echo "${R[surge1,$row]}" | median); sn=$(echo "${R[surgeN,$row]}" | median)
    unit=$([[ $row == seq* ]] && echo MiB/s || echo ops/s)
    printf '%-15s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n' "$row" "$raw" "$pll" "$plld" "$s1" "$sn" "$sp" \
        "$(ratio "$s1" "$raw")" "$(ratio "$sn" "$raw")" "$(ratio "$pll" "$raw")" "$(ratio "$s1" "$pll")" "$(ratio "$sn" "$pll")" \
        "$(ratio "$sp" "$pll")" "$(ratio "$s1" "$plld")" "$(ratio "$sn" "$plld")" "$(ratio "$sp" "$plld")" "$unit"
    [ $first -eq 1 ] || JS+=", "; first=0
    JS+="\"$row\": {\"unit\": \"$unit\", \"raw\": $raw, \"pll\": $pll, \"plld\": $([ "$plld" = - ] && echo null || echo "$plld"), \"surge1\": $s1, \"surgeN\": $sn, \"surgeP\": $([ "$sp" = - ] && echo null || echo "$sp")}"
done
JS+="}}"
[ -z "$JSON" ] || echo "$JS" >"$JSON"
