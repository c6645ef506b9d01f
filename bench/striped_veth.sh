#!/usr/bin/env bash
# Striped instances across hosts (issue 17, lever 5): one compute host and two burst-buffer
# hosts, each in its own network namespace on one bridge, each BB host's link shaped to RATE
# in both directions (tc tbf: the network is the bottleneck, as on a cluster). In one run:
#   iperf3     - TCP from the compute host to one BB host and back, STREAMS streams: what the
#                link gives;
#   iperf3-2   - the same to both BB hosts at once (STREAMS streams each): what two links give
#                this compute host, the ceiling of surge-2 (on a small VM the CPU, not the
#                links, may set it);
#   surge-1    - fio (STREAMS processes, 8 MiB, file per process) writing then reading an
#                instance on one BB host (through the compute host's mount; its servers' files
#                are not visible there: each server keeps its device in a mount namespace of
#                its own);
#   surge-2    - the same on an instance striped over both BB hosts (8 MiB stripes over every
#                fragment, DataWarp's layout).
# Bars: surge-1 >= 0.8 of iperf3 (each direction), surge-2 >= 1.6x surge-1 (bandwidth grows
# with the BB hosts a file spans; Daley's premise). Printed too: iperf3-2 / iperf3 (how much a
# second host can add at all here) and surge-2 / iperf3-2. Sides alternate their order per run.
# With --tls, each BB host also runs a server with TLS on (a certificate of a CA made for the
# run; the other server is --tls off), and surge-1t / surge-2t (the same instances, the mounts
# verifying the certificates) run beside surge-1 / surge-2 in every run, order alternating;
# printed: surge-Nt / surge-N per direction (bars: >= 0.8 at 10gbit, >= 0.95 at 2gbit).
#
#   bench/striped_veth.sh [--runs 3] [--rate 2gbit] [--streams 2] [--size 512M] [--tls]
#
# Needs root (namespaces, tc, FUSE), fio, iperf3. SURGE=path (default target/release/surge).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 RATE=2gbit STREAMS=2 SIZE=512M TLS=0
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --streams) STREAMS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --tls) TLS=1; shift ;;
        -h|--help) sed -n 2,24p "$0"; exit 0 ;;
        *) echo "striped_veth.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "striped_veth.sh: run as root (namespaces, tc, FUSE)" >&2; exit 2; }
for tool in fio iperf3 ip tc python3; do
    command -v $tool >/dev/null || { echo "striped_veth.sh: $tool is missing (apt-get install fio iperf3 iproute2)" >&2; exit 2; }
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
SURGE=$(realpath "$SURGE")

NET=10.79.0 BR=svbr0
WORK=$(mktemp -d /tmp/surge-veth.XXXXXX)
(umask 077; head -c 32 /dev/urandom >"$WORK/surge.key")
export SURGE_KEY_FILE="$WORK/surge.key"
PIDS=()
MNTS=()
SERVER_PIDS=()
declare -A MOUNT_PID
cleanup() {
    for m in "${MNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    cleanup_net
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# --- topology: bridge in the root namespace, one veth per host ---
cleanup_net() {
    for n in sv-c sv-b1 sv-b2; do ip netns del $n 2>/dev/null || true; ip link del "v-$n" 2>/dev/null || true; done
    ip link del $BR 2>/dev/null || true
}
cleanup_net
ip link add $BR type bridge
ip addr add $NET.1/24 dev $BR
ip link set $BR up
declare -A IP=([sv-c]=$NET.10 [sv-b1]=$NET.11 [sv-b2]=$NET.12)
for n in sv-c sv-b1 sv-b2; do
    ip netns add $n
    ip link add "v-$n" type veth peer name eth0 netns $n
    ip link set "v-$n" master $BR up
    ip netns exec $n ip addr add "${IP[$n]}/24" dev eth0
    ip netns exec $n ip link set eth0 up
    ip netns exec $n ip link set lo up
done
# Each BB host's link, both ways: egress of its eth0 (BB -> compute: reads) and of the bridge's
# veth towards it (compute -> BB: writes).
for n in sv-b1 sv-b2; do
    ip netns exec $n tc qdisc add dev eth0 root tbf rate "$RATE" burst 2mb latency 100ms
    tc qdisc add dev "v-$n" root tbf rate "$RATE" burst 2mb latency 100ms
done

# --- servers, each with its device in a mount namespace of its own ---
# Clear text on port 7001 (--tls off); with --tls, a second server on 7002 speaks TLS only.
if [ "$TLS" -eq 1 ]; then
    "$SURGE" cert ca --dir "$WORK/tls" >/dev/null
    for n in sv-b1 sv-b2; do
        "$SURGE" cert server "${IP[$n]}" --ca-cert "$WORK/tls/ca.crt" --out "$WORK/tls/$n" >/dev/null
    done
    export SURGE_TLS_CA="$WORK/tls/ca.crt"
    PORTS="7001:off 7002:on"
else
    PORTS="7001:off"
fi
for n in sv-b1 sv-b2; do
    for pt in $PORTS; do
        port=${pt%%:*} dev=/run/$n-dev-${pt%%:*}
        mkdir -p "$dev"
        ip netns exec $n unshare -m --propagation private sh -c \
            "mount -t tmpfs -o size=9g tmpfs $dev && exec $SURGE server --device $dev/bb --capacity 8GiB \
             --listen ${IP[$n]}:$port --tls ${pt#*:} --tls-cert $WORK/tls/$n/server.crt \
             --ready-file $WORK/$n-$port.ready" 2>"$WORK/$n-$port.log" &
        PIDS+=($!); SERVER_PIDS+=($!)
    done
done
for n in sv-b1 sv-b2; do
    for pt in $PORTS; do
        r=$WORK/$n-${pt%%:*}
        for _ in $(seq 200); do [ -s "$r.ready" ] && break; sleep 0.05; done
        [ -s "$r.ready" ] || { echo "server in $n did not start:" >&2; cat "$r.log" >&2; exit 1; }
    done
done
mkid() { python3 -c 'import json,sys; print(json.load(sys.stdin)["instance"])'; }
S1=${IP[sv-b1]}:7001 S2=${IP[sv-b2]}:7001
ID1=$(ip netns exec sv-c env SURGE_TLS=off "$SURGE" instance create --servers "$S1" --capacity 4GiB --json | mkid)
ID2=$(ip netns exec sv-c env SURGE_TLS=off "$SURGE" instance create --servers "$S1,$S2" --capacity 6GiB --json | mkid)
SIDES="1 2"
declare -A SRV=([1]=$S1 [2]=$S1) TLSMODE=([1]=off [2]=off)
if [ "$TLS" -eq 1 ]; then
    T1=${IP[sv-b1]}:7002 T2=${IP[sv-b2]}:7002
    ID1t=$(ip netns exec sv-c env SURGE_TLS=on "$SURGE" instance create --servers "$T1" --capacity 4GiB --json | mkid)
    ID2t=$(ip netns exec sv-c env SURGE_TLS=on "$SURGE" instance create --servers "$T1,$T2" --capacity 6GiB --json | mkid)
    SIDES="1 2 1t 2t"
    SRV+=([1t]=$T1 [2t]=$T1); TLSMODE+=([1t]=on [2t]=on)
fi
for side in $SIDES; do
    id=ID$side
    mkdir -p "$WORK/m$side"
    # nsenter --net: the network namespace only (ip netns exec would mount in a mount namespace
    # of its own, out of fio's sight).
    SURGE_TLS=${TLSMODE[$side]} nsenter --net=/run/netns/sv-c "$SURGE" mount --server "${SRV[$side]}" \
        --instance "${!id}" --layout stripe_count=all \
        --ready-file "$WORK/m$side.ready" "$WORK/m$side" 2>"$WORK/m$side.log" &
    PIDS+=($!); MNTS+=("$WORK/m$side"); MOUNT_PID[$side]=$!
done
for side in $SIDES; do
    for _ in $(seq 200); do [ -s "$WORK/m$side.ready" ] && break; sleep 0.05; done
    mountpoint -q "$WORK/m$side" || { echo "mount $side failed:" >&2; cat "$WORK/m$side.log" >&2; exit 1; }
done
for n in sv-b1 sv-b2; do
    ip netns exec $n iperf3 -s -D -p 5201 -I "$WORK/iperf-$n.pid" --logfile "$WORK/iperf-$n.log"
    for _ in $(seq 50); do [ -s "$WORK/iperf-$n.pid" ] && break; sleep 0.05; done
    PIDS+=("$(cat "$WORK/iperf-$n.pid")")
done

# CPU seconds (user + system, all threads) the given processes have used so far.
cpu_s() { local t=0 p f; for p in "$@"; do f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue; t=$((t + ${f% *} + ${f#* })); done
    echo "$t $(getconf CLK_TCK)" | awk '{printf "%.2f", $1 / $2}'; }
# Busy CPU seconds of the whole machine so far (every vCPU, all but idle and iowait).
busy_s() { awk '/^cpu /{printf "%.2f", ($2+$3+$4+$7+$8+$9) / '"$(getconf CLK_TCK)"'}' /proc/stat; }
mibs() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f" % (d[sys.argv[2]]["bw_bytes"]/1048576))' "$1" "$2"; }
RESULTS=$WORK/results; : >"$RESULTS"
CPU=$WORK/cpu; : >"$CPU"
side_iperf() {
    local up down
    up=$(ip netns exec sv-c iperf3 -c ${IP[sv-b1]} -P "$STREAMS" -t 5 -J | python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8/1048576))')
    down=$(ip netns exec sv-c iperf3 -c ${IP[sv-b1]} -P "$STREAMS" -t 5 -R -J | python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8/1048576))')
    echo "$1 iperf3 write $up" >>"$RESULTS"; echo "$1 iperf3 read $down" >>"$RESULTS"
    # Both BB hosts at once.
    local dir flag
    for dir in write read; do
        flag=(); [ $dir = read ] && flag=(-R)
        ip netns exec sv-c iperf3 -c ${IP[sv-b1]} -P "$STREAMS" -t 5 "${flag[@]}" -J >"$WORK/i1.json" &
        ip netns exec sv-c iperf3 -c ${IP[sv-b2]} -P "$STREAMS" -t 5 "${flag[@]}" -J >"$WORK/i2.json"
        wait $!
        echo "$1 iperf3-2 $dir $(python3 -c 'import json,sys; print("%.0f" % (sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] for f in sys.argv[1:])/8/1048576))' "$WORK/i1.json" "$WORK/i2.json")" >>"$RESULTS"
    done
}
cpu_mark() { # SIDE: "mount servers machine" CPU seconds so far
    echo "$(cpu_s "${MOUNT_PID[$1]}") $(cpu_s "${SERVER_PIDS[@]}") $(busy_s)"
}
cpu_row() { # RUN SIDE DIR MARK: CPU-s per GiB since MARK (cpu_mark's line)
    local gib
    gib=$(awk -v s="$SIZE" -v n="$STREAMS" 'BEGIN { u = toupper(substr(s, length(s))); v = s + 0;
        if (u == "G") v *= 1024; else if (u == "K") v /= 1024; else if (u != "M") v /= 1048576; print v * n / 1024 }')
    echo "$1 $2 $3 $(echo "$4 $(cpu_mark "$2") $gib" |
        awk '{printf "%.3f %.3f %.3f", ($4-$1)/$7, ($5-$2)/$7, ($6-$3)/$7}')" >>"$CPU"
}
side_surge() {
    local m=$WORK/m$2 fio=(fio --name=s --directory="$WORK/m$2/d" --bs=8M --size="$SIZE" --numjobs="$STREAMS"
        --ioengine=psync --group_reporting --output-format=json)
    mkdir -p "$m/d"
    local mark
    # Where the CPU goes (seconds per GiB moved): the compute host's mount, the servers, the
    # whole machine (fio and the kernel's network work included).
    mark=$(cpu_mark "$2")
    "${fio[@]}" --rw=write --end_fsync=1 >"$WORK/w.json"
    cpu_row "$1" "$2" write "$mark"
    # The client's page cache must not answer the reads: drop it.
    sync; echo 3 >/proc/sys/vm/drop_caches
    mark=$(cpu_mark "$2")
    "${fio[@]}" --rw=read >"$WORK/r.json"
    cpu_row "$1" "$2" read "$mark"
    rm -rf "$m/d"
    echo "$1 surge-$2 write $(mibs "$WORK/w.json" write)" >>"$RESULTS"
    echo "$1 surge-$2 read $(mibs "$WORK/r.json" read)" >>"$RESULTS"
}
for run in $(seq "$RUNS"); do
    if [ "$TLS" -eq 1 ]; then
        if [ $((run % 2)) -eq 1 ]; then order=(iperf 1 1t 2 2t); else order=(2t 2 1t 1 iperf); fi
    elif [ $((run % 2)) -eq 1 ]; then order=(iperf 1 2); else order=(2 1 iperf); fi
    for s in "${order[@]}"; do
        case $s in iperf) side_iperf "$run" ;; *) side_surge "$run" "$s" ;; esac
    done
    echo "run $run ($(IFS=,; echo "${order[*]}")) done" >&2
done

python3 - "$CPU" <<'EOF'
import statistics, sys
v = {}
for l in open(sys.argv[1]):
    run, side, d, m, srv, busy = l.split()
    v.setdefault((side, d), []).append((float(m), float(srv), float(busy)))
print("\nCPU seconds per GiB moved (medians): the compute host's mount, the BB servers, the whole machine")
print(f"{'instance':9} {'dir':6} {'mount':>7} {'servers':>8} {'machine':>8}")
for (side, d), rows in sorted(v.items()):
    m, s, b = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"surge-{side:3} {d:6} {m:7.2f} {s:8.2f} {b:8.2f}")
EOF
python3 - "$RESULTS" "$RATE" "$STREAMS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
v = {}
for run, side, d, val in rows:
    v.setdefault((side, d), {})[int(run)] = float(val)
med = lambda k: statistics.median(v[k].values())
print(f"\nlinks shaped to {sys.argv[2]} per BB host, {sys.argv[3]} streams; MiB/s, medians of {len(v[('iperf3','write')])} runs")
print(f"{'dir':6} {'iperf3':>8} {'iperf3-2':>8} {'surge-1':>8} {'surge-2':>8} {'s1/iperf':>9} {'s2/s1':>7} {'i2/i1':>6} {'s2/i2':>6}   per run s1/iperf, s2/s1, i2/i1")
for d in ("write", "read"):
    i, i2, a, b = med(("iperf3", d)), med(("iperf3-2", d)), med(("surge-1", d)), med(("surge-2", d))
    per = [(v[("surge-1", d)][r] / v[("iperf3", d)][r], v[("surge-2", d)][r] / v[("surge-1", d)][r],
            v[("iperf3-2", d)][r] / v[("iperf3", d)][r]) for r in sorted(v[("iperf3", d)])]
    print(f"{d:6} {i:8.0f} {i2:8.0f} {a:8.0f} {b:8.0f} {a/i:9.2f} {b/a:7.2f} {i2/i:6.2f} {b/i2:6.2f}   "
          + "  ".join(f"{x:.2f},{y:.2f},{z:.2f}" for x, y, z in per))
if ("surge-1t", "write") in v:
    print(f"\nTLS against clear text (same run, order alternating): MiB/s, medians; tls/clear per run")
    print(f"{'dir':6} {'surge-1':>8} {'surge-1t':>8} {'1t/1':>6} {'surge-2':>8} {'surge-2t':>8} {'2t/2':>6}   per run 1t/1, 2t/2")
    for d in ("write", "read"):
        a, at, b, bt = (med((k, d)) for k in ("surge-1", "surge-1t", "surge-2", "surge-2t"))
        per = [(v[("surge-1t", d)][r] / v[("surge-1", d)][r], v[("surge-2t", d)][r] / v[("surge-2", d)][r])
               for r in sorted(v[("surge-1", d)])]
        print(f"{d:6} {a:8.0f} {at:8.0f} {at/a:6.2f} {b:8.0f} {bt:8.0f} {bt/b:6.2f}   "
              + "  ".join(f"{x:.2f},{y:.2f}" for x, y in per))
EOF
