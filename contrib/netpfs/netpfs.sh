#!/bin/bash
# netpfs.sh — a network "PFS" on one machine: a GlusterFS server in a network namespace, reached
# over a veth link with a bandwidth limit (tc HTB) and a latency (nfdelay, an NFQUEUE program:
# this kernel has no netem), mounted with GlusterFS's FUSE client. Unlike contrib/slowpfs (a
# throttled local disk: bandwidth only), every open, stat and create here is a network round
# trip, as on Lustre or GPFS, so metadata-heavy work (a Python import, many small files) feels a
# parallel file system's per-operation latency.
#
#   netpfs.sh up     [--dir DIR] [--rate RATE] [--delay-us N]
#   netpfs.sh down
#   netpfs.sh cold                 remount the client: its caches go (a cold PFS for the next reader)
#   netpfs.sh status [--json]
#   netpfs.sh probe  [--json]      round trip, create/stat/unlink rates, sequential write/read
#
# What `up` builds (about 5 s; installs glusterfs-server, glusterfs-client, iptables and
# libnetfilter-queue-dev with apt if missing, and compiles nfdelay.c):
#
#   netns surge_pfs_srv  10.98.7.1  glusterd + the brick (a directory on disk: /var/tmp/surge-netpfs)
#        | veth, HTB RATE each way, DELAY_US added per direction at the receiving end
#   netns surge_pfs_cli  10.98.7.2  the GlusterFS FUSE client; its mount is in the host's mount
#                                   namespace at DIR (default /run/surge-netpfs/pfs), mode 1777
#
# Defaults: --rate 1gbit, --delay-us 250 (a round trip of ~0.5 ms more than the bare veth; a
# GlusterFS create then costs several round trips, as a Lustre create costs MDS RPCs).
# Only one instance per host (glusterd has one socket per host). Needs root for up/down/cold.
set -euo pipefail
export LC_ALL=C

PROG=netpfs
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=/run/surge-netpfs
WORK=${NETPFS_WORK_DIR:-/var/tmp/surge-netpfs}
SRV=surge_pfs_srv CLI=surge_pfs_cli
SRV_IP=10.98.7.1 CLI_IP=10.98.7.2
VOL=surgepfs

die() { echo "$PROG: error: $*" >&2; exit 1; }
info() { echo "$PROG: $*" >&2; }

usage() { sed -n 2,26p "$0" | sed 's/^# \{0,1\}//'; }

# PIDs of live processes named $1 (not zombies: PID 1 here reaps killed orphans late).
live() { ps -eo pid=,stat=,comm= | awk -v n="$1" '$2 !~ /^Z/ && $3 == n { print $1 }'; }

need_root() { [ "$(id -u)" = 0 ] || die "'$1' needs root (network namespaces, mounts, iptables)"; }

conf() { [ -f "$STATE/conf" ] && . "$STATE/conf"; }

install_deps() {
    local missing=()
    command -v glusterd >/dev/null || missing+=(glusterfs-server)
    command -v mount.glusterfs >/dev/null || [ -x /sbin/mount.glusterfs ] || missing+=(glusterfs-client)
    command -v iptables >/dev/null || missing+=(iptables)
    [ -f /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || missing+=(libnetfilter-queue-dev)
    command -v gcc >/dev/null || missing+=(gcc)
    if [ ${#missing[@]} -gt 0 ]; then
        info "installing ${missing[*]} (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
            die "apt-get install ${missing[*]} failed"
    fi
    if [ ! -x "$WORK/nfdelay" ] || [ "$HERE/nfdelay.c" -nt "$WORK/nfdelay" ]; then
        gcc -O2 -Wall -o "$WORK/nfdelay" "$HERE/nfdelay.c" -lnetfilter_queue -lnfnetlink ||
            die "cannot build $HERE/nfdelay.c"
    fi
}

# HTB at RATE on the device of namespace $1, and nfdelay on its ingress (PREROUTING: the
# egress hook stalls TCP's small queues at ms delays).
shape() {
    local ns=$1 dev=$2
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
    ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE" burst 64k cburst 64k quantum 60000
    ip netns exec "$ns" iptables -t mangle -F PREROUTING
    if [ "$DELAY_US" -gt 0 ]; then
        ip netns exec "$ns" iptables -t mangle -A PREROUTING -i "$dev" -j NFQUEUE --queue-num 0 --queue-bypass
        ip netns exec "$ns" setsid "$WORK/nfdelay" 0 "$DELAY_US" </dev/null >>"$WORK/log/nfdelay-$ns.log" 2>&1 &
        echo $! > "$STATE/nfdelay-$ns.pid"
    fi
}

unshape() {
    local ns
    for ns in $SRV $CLI; do
        if [ -f "$STATE/nfdelay-$ns.pid" ]; then
            kill "$(cat "$STATE/nfdelay-$ns.pid")" 2>/dev/null || true
            rm -f "$STATE/nfdelay-$ns.pid"
        fi
    done
}

mount_client() {
    nsenter --net=/run/netns/$CLI mount -t glusterfs \
        -o "log-file=$WORK/log/client.log" "$SRV_IP:/$VOL" "$DIR" ||
        die "mounting $SRV_IP:/$VOL on $DIR failed (log: $WORK/log/client.log)"
}

up() {
    need_root up
    DIR=/run/surge-netpfs/pfs RATE=1gbit DELAY_US=250
    while [ $# -gt 0 ]; do
        case $1 in
            --dir) DIR=$2; shift 2 ;;
            --rate) RATE=$2; shift 2 ;;
            --delay-us) DELAY_US=$2; shift 2 ;;
            *) die "unknown option '$1' of up (see --help)" ;;
        esac
    done
    [[ $DELAY_US =~ ^[0-9]+$ ]] || die "--delay-us '$DELAY_US' is not a number of microseconds"
    [[ $RATE =~ ^[0-9]+(k|m|g)?bit$ ]] || die "--rate '$RATE' is not a tc rate such as 1gbit or 500mbit"
    if [ -f "$STATE/conf" ]; then
        local old_dir; old_dir=$(. "$STATE/conf"; echo "$DIR")
        [ "$old_dir" = "$DIR" ] || die "already up at $old_dir: 'netpfs.sh down' first"
        if mountpoint -q "$DIR"; then
            info "up at $DIR: re-shaping to $RATE, +$DELAY_US us per direction"
            unshape
            shape $SRV veth_pfs_srv
            shape $CLI veth_pfs_cli
            printf 'DIR=%s\nRATE=%s\nDELAY_US=%s\n' "$DIR" "$RATE" "$DELAY_US" > "$STATE/conf"
            return
        fi
        die "state in $STATE but $DIR is not mounted: 'netpfs.sh down' first"
    fi
    mkdir -p "$STATE" "$WORK"/{lib,run,log}
    install_deps
    [ -z "$(live glusterd)" ] || die "a glusterd already runs on this host (pid $(live glusterd | head -1)); one per host"
    printf 'DIR=%s\nRATE=%s\nDELAY_US=%s\n' "$DIR" "$RATE" "$DELAY_US" > "$STATE/conf"

    ip netns add $SRV
    ip netns add $CLI
    ip link add veth_pfs_cli type veth peer name veth_pfs_srv
    ip link set veth_pfs_srv netns $SRV
    ip link set veth_pfs_cli netns $CLI
    ip -n $SRV addr add $SRV_IP/24 dev veth_pfs_srv
    ip -n $CLI addr add $CLI_IP/24 dev veth_pfs_cli
    for ns in $SRV $CLI; do
        ip -n $ns link set lo up
        ip -n $ns link set "veth_${ns#surge_}" up
    done
    shape $SRV veth_pfs_srv
    shape $CLI veth_pfs_cli

    sed -e "s#/var/lib/glusterd#$WORK/lib#" \
        -e "s#    option ping-timeout 0#    option ping-timeout 0\n    option run-directory $WORK/run#" \
        /etc/glusterfs/glusterd.vol > "$WORK/glusterd.vol"
    ip netns exec $SRV glusterd -f "$WORK/glusterd.vol" -p "$WORK/glusterd.pid" -l "$WORK/log/glusterd.log"
    local i
    for i in $(seq 1 50); do
        gluster --mode=script pool list >/dev/null 2>&1 && break
        sleep 0.2
    done
    mkdir -p "$WORK/brick"
    gluster --mode=script volume create $VOL transport tcp "$SRV_IP:$WORK/brick" force >/dev/null ||
        die "gluster volume create failed (log: $WORK/log/glusterd.log)"
    gluster --mode=script volume start $VOL >/dev/null || die "gluster volume start failed"
    mkdir -p "$DIR"
    for i in $(seq 1 25); do
        mount_client 2>/dev/null && break
        [ "$i" = 25 ] && mount_client
        sleep 0.2
    done
    chmod 1777 "$DIR"
    info "up: $DIR (GlusterFS over veth, $RATE, +$DELAY_US us per direction)"
}

down() {
    need_root down
    conf || true
    local dir=${DIR:-/run/surge-netpfs/pfs}
    if mountpoint -q "$dir" 2>/dev/null; then umount "$dir" || umount -l "$dir"; fi
    if [ -n "$(live glusterd)" ]; then
        gluster --mode=script volume stop $VOL force >/dev/null 2>&1 || true
        gluster --mode=script volume delete $VOL >/dev/null 2>&1 || true
    fi
    # glusterd, the brick and the client take a moment to go: wait up to 10 s, then SIGKILL.
    local pat="glusterd -f $WORK/glusterd.vol|glusterfsd.*$VOL|glusterfs.*$SRV_IP.*$VOL" i
    pkill -f "$pat" 2>/dev/null || true
    for i in $(seq 1 50); do
        pgrep -f "$pat" >/dev/null || break
        [ "$i" = 50 ] && pkill -9 -f "$pat" 2>/dev/null
        sleep 0.2
    done
    unshape
    ip netns del $SRV 2>/dev/null || true
    ip netns del $CLI 2>/dev/null || true
    sleep 0.5
    rm -rf "$WORK/lib" "$WORK/brick" "$WORK/run" "$WORK/glusterd.pid" "$STATE"
    rmdir "$dir" 2>/dev/null || true
    info "down"
}

cold() {
    need_root cold
    conf || die "not up"
    umount "$DIR"
    mount_client
}

status() {
    local json=0; [ "${1:-}" = --json ] && json=1
    if ! conf; then
        [ $json = 1 ] && echo '{"up":false}' || echo "netpfs: down"
        return 0
    fi
    local mounted=false; mountpoint -q "$DIR" && mounted=true
    if [ $json = 1 ]; then
        printf '{"up":true,"dir":"%s","mounted":%s,"rate":"%s","delay_us_per_direction":%s,"server":"%s"}\n' \
            "$DIR" "$mounted" "$RATE" "$DELAY_US" "$SRV_IP"
    else
        echo "netpfs: up at $DIR (mounted: $mounted), GlusterFS at $SRV_IP over veth, $RATE, +$DELAY_US us per direction"
    fi
}

# Round trip (a TCP ping-pong in the namespaces), metadata rates and dd in DIR.
probe() {
    local json=0; [ "${1:-}" = --json ] && json=1
    conf || die "not up"
    local d="$DIR/.probe.$$" n=200 t0 t1 create stat unlink w r
    mkdir -p "$d"
    t0=$(date +%s%N); for i in $(seq 1 $n); do : > "$d/f$i"; done; t1=$(date +%s%N)
    create=$(( n * 1000000000 / (t1 - t0) ))
    t0=$(date +%s%N); for i in $(seq 1 $n); do stat -c %s "$d/f$i" >/dev/null; done; t1=$(date +%s%N)
    stat=$(( n * 1000000000 / (t1 - t0) ))
    t0=$(date +%s%N); rm -f "$d"/f*; t1=$(date +%s%N)
    unlink=$(( n * 1000000000 / (t1 - t0) ))
    w=$(dd if=/dev/zero of="$d/big" bs=1M count=256 conv=fsync 2>&1 | awk '/copied/ { print $(NF-1) $NF }')
    r=$(dd if="$d/big" of=/dev/null bs=1M iflag=direct 2>&1 | awk '/copied/ { print $(NF-1) $NF }')
    rm -rf "$d"
    if [ $json = 1 ]; then
        printf '{"creates_per_s":%s,"stats_per_s":%s,"unlinks_per_s":%s,"write":"%s","read":"%s"}\n' \
            "$create" "$stat" "$unlink" "$w" "$r"
    else
        echo "creates $create/s, stats $stat/s (shell, one process each), unlinks $unlink/s; dd 256 MiB: write $w, read $r"
    fi
}

case ${1:-} in
    up) shift; up "$@" ;;
    down) down ;;
    cold) cold ;;
    status) shift; status "$@" ;;
    probe) shift; probe "$@" ;;
    -h|--help|help|"") usage ;;
    *) die "unknown command '$1' (up, down, cold, status, probe; see --help)" ;;
esac
