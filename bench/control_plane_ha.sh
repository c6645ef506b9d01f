#!/bin/bash
# The control plane under load while its leader keeps dying (issue 30): a three-member etcd
# (Debian's etcd-server), two `surge manager`s on it (one leads, one stands by), servers, and
# `surge bench control-plane` driving jobs through every phase from N emulated agents; every
# --kill-every seconds the leading manager is killed with SIGKILL and started again (as
# systemd's Restart=always would), so each kill is a failover to the other one.
#
#   bench/control_plane_ha.sh [--duration 600] [--kill-every 60] [--agents 1000]
#                             [--concurrency 50] [--run-seconds 3] [--servers 4] [--json]
#                             [--tls]
#
# --tls: etcd speaks only TLS on its client and peer ports and asks every client and peer for
# a certificate (made by `surge cert`: a CA, a --peer certificate for the members, a client
# certificate for the managers); the managers use --etcd-ca/--etcd-cert/--etcd-key.
#
# Prints the load generator's report (phase p50/p99/max, jobs/hour, jobs that ran without their
# instance, instances given twice, pool bytes not returned after the last teardown) and one line
# per kill: which manager, when, and how long until the other one served. Everything runs on
# loopback in a scratch directory under /dev/shm, removed at the end. Needs etcd and munge
# (`make setup` installs both); build the binary first (`cargo build --release -p surge-cli`,
# or set SURGE=path).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=600 KILL_EVERY=60 AGENTS=1000 CONC=50 RUN_S=3 SERVERS=4 JSON= TLS=
while [ $# -gt 0 ]; do
    case $1 in
        --duration) DURATION=$2; shift 2 ;;
        --kill-every) KILL_EVERY=$2; shift 2 ;;
        --agents) AGENTS=$2; shift 2 ;;
        --concurrency) CONC=$2; shift 2 ;;
        --run-seconds) RUN_S=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --json) JSON=--json; shift ;;
        --tls) TLS=1; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
SURGE=${SURGE:-$PWD/target/release/surge}
[ -x "$SURGE" ] || { echo "no $SURGE: build it (cargo build --release -p surge-cli) or set SURGE" >&2; exit 2; }
for t in etcd etcdctl munged mungekey; do
    command -v $t >/dev/null || { echo "$t is not installed (make setup installs etcd-server, etcd-client and munge)" >&2; exit 2; }
done

D=$(mktemp -d /dev/shm/surge-cp-ha.XXXXXX)
PIDS=()
cleanup() {
    exec 2>/dev/null
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    [ -f $D/m1.pid ] && kill -9 "$(cat $D/m1.pid)" 2>/dev/null || true
    [ -f $D/m2.pid ] && kill -9 "$(cat $D/m2.pid)" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# MUNGE and the cluster key.
mkdir -m 0700 $D/munge
mungekey --create --keyfile=$D/munge/munge.key
munged --foreground --force --socket=$D/munge/sock --key-file=$D/munge/munge.key \
    --pid-file=$D/munge/pid --log-file=$D/munge/log --seed-file=$D/munge/seed 2>/dev/null &
PIDS+=($!)
export SURGE_MUNGE_SOCKET=$D/munge/sock
"$SURGE" key create --key-file $D/surge.key >/dev/null
export SURGE_KEY_FILE=$D/surge.key
# 1000s of agents from one address.
export SURGE_MANAGER_MAX_PER_ADDRESS=$((AGENTS * 2 + 1000))
ulimit -n "$(ulimit -Hn)"

# etcd: three members (with --tls: TLS and client certificates on client and peer ports).
S=http ETCD_TLS=() CTL_TLS=() MGR_TLS=()
if [ -n "$TLS" ]; then
    S=https T=$D/tls
    "$SURGE" cert ca --dir $T >/dev/null
    "$SURGE" cert server 127.0.0.1 localhost --peer --ca-cert $T/ca.crt --out $T/etcd >/dev/null
    "$SURGE" cert client surge-manager --ca-cert $T/ca.crt --out $T/client >/dev/null
    ETCD_TLS=(--cert-file $T/etcd/server.crt --key-file $T/etcd/server.key --trusted-ca-file $T/ca.crt
        --client-cert-auth --peer-cert-file $T/etcd/server.crt --peer-key-file $T/etcd/server.key
        --peer-trusted-ca-file $T/ca.crt --peer-client-cert-auth)
    CTL_TLS=(--cacert $T/ca.crt --cert $T/client/client.crt --key $T/client/client.key)
    MGR_TLS=(--etcd-ca $T/ca.crt --etcd-cert $T/client/client.crt --etcd-key $T/client/client.key)
fi
CLUSTER= ENDPOINTS=
declare -a CP PP
for i in 1 2 3; do
    CP[$i]=$(free_port); PP[$i]=$(free_port)
    CLUSTER+="${CLUSTER:+,}e$i=$S://127.0.0.1:${PP[$i]}"
    ENDPOINTS+="${ENDPOINTS:+,}$S://127.0.0.1:${CP[$i]}"
done
for i in 1 2 3; do
    etcd --name e$i --data-dir $D/etcd$i --log-level warn \
        --listen-client-urls $S://127.0.0.1:${CP[$i]} --advertise-client-urls $S://127.0.0.1:${CP[$i]} \
        --listen-peer-urls $S://127.0.0.1:${PP[$i]} --initial-advertise-peer-urls $S://127.0.0.1:${PP[$i]} \
        --initial-cluster "$CLUSTER" --initial-cluster-state new "${ETCD_TLS[@]}" 2>>$D/etcd$i.log &
    PIDS+=($!)
done
for _ in $(seq 60); do
    ETCDCTL_API=3 etcdctl "${CTL_TLS[@]}" --endpoints "$ENDPOINTS" endpoint health >/dev/null 2>&1 && break
    sleep 0.5
done

# Two managers on it, on fixed ports (every client is given both).
G1=$(free_port) G2=$(free_port) H1=$(free_port) H2=$(free_port)
MANAGERS=127.0.0.1:$G1,127.0.0.1:$G2
start_manager() { # NAME GRPC HTTP
    "$SURGE" manager --etcd "$ENDPOINTS" "${MGR_TLS[@]}" --etcd-prefix /surge-bench/ --name $1 \
        --listen 127.0.0.1:$2 --http 127.0.0.1:$3 --key-file $D/surge.key \
        --munge-socket $D/munge/sock --granularity 64MiB 2>>$D/$1.log &
    echo $! > $D/$1.pid
}
start_manager m1 $G1 $H1
start_manager m2 $G2 $H2
for _ in $(seq 60); do "$SURGE" pool --manager $MANAGERS ls >/dev/null 2>&1 && break; sleep 0.5; done

# Servers, registering with whichever manager leads.
for i in $(seq $SERVERS); do
    mkdir -p $D/bb$i
    "$SURGE" server --device $D/bb$i --listen 127.0.0.1:0 --capacity 64GiB \
        --manager $MANAGERS --key-file $D/surge.key 2>>$D/server$i.log &
    PIDS+=($!)
done
for _ in $(seq 60); do
    "$SURGE" pool --manager $MANAGERS ls --json 2>/dev/null | grep -Eq "\"servers_up\": *$SERVERS" && break
    sleep 0.5
done

leader_name() {
    ETCDCTL_API=3 etcdctl "${CTL_TLS[@]}" --endpoints "$ENDPOINTS" get /surge-bench/leader --print-value-only 2>/dev/null |
        python3 -c 'import json,sys; d=sys.stdin.read().strip(); print(json.loads(d)["name"] if d else "")'
}

# The killer: every KILL_EVERY s, SIGKILL the leader, start it again, time the takeover.
(
    sleep "$KILL_EVERY"
    end=$((SECONDS + DURATION - KILL_EVERY))
    while [ $SECONDS -le $end ]; do
        l=$(leader_name)
        if [ -n "$l" ]; then
            t0=$(date +%s.%N)
            kill -9 "$(cat $D/$l.pid)" 2>/dev/null || true
            # Who serves next: a leader record naming the other manager.
            while [ "$(leader_name)" = "$l" ] || [ -z "$(leader_name)" ]; do sleep 0.05; done
            t1=$(date +%s.%N)
            echo "kill: $l at $(date +%T), $(leader_name) led $(python3 -c "print(f'{$t1-$t0:.1f}')") s later" >&2
            if [ $l = m1 ]; then start_manager m1 $G1 $H1; else start_manager m2 $G2 $H2; fi
        fi
        sleep "$KILL_EVERY"
    done
) &
KILLER=$!
PIDS+=($KILLER)

"$SURGE" bench control-plane --manager $MANAGERS --agents "$AGENTS" --concurrency "$CONC" \
    --run-seconds "$RUN_S" --duration "$DURATION" --jobs 100000000 --idle 1 $JSON
pkill -P "$KILLER" 2>/dev/null || true  # its sleep, which holds our stdout
kill $KILLER 2>/dev/null || true
