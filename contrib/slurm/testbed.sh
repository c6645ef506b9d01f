#!/bin/bash
# A whole Surge + Slurm cluster on one machine, as a recipe an admin can read (run as root).
#
#   testbed.sh up [--ha]           bring it up (idempotent); --ha: the state in a 3-member
#                                  etcd and two managers on it, one leading (hosts sg-m1,
#                                  sg-m2, sg-e3), clients given both managers; etcd speaks
#                                  TLS only and wants a client certificate (its own CA in
#                                  $TB/etc/etcd-tls, below)
#   testbed.sh down                take it down (idempotent; leaves nothing behind)
#   testbed.sh sbatch USER SCRIPT [SBATCH-ARGS...]
#                                  submit SCRIPT as USER, wait for the job to end, print
#                                  "job ID STATE EXITCODE OUTPUT-PATH"
#   testbed.sh status              hosts, daemons, Surge sessions and agents (with --ha, a
#                                  line "manager NAME leader pid PID")
#
# Hosts are network namespaces joined by a bridge (all Surge and Slurm traffic crosses veths):
#
#   root netns ("sgctl", 10.78.0.1): munged, slurmctld (own UTS name), surge manager;
#                                    the "PFS" is $TB/pfs (a directory every host sees)
#   sg-bb1/sg-bb2 (10.78.0.21/.22):  surge server and surge mover each (fast tier
#                                    /dev/shm/surge-tb/bbN; the movers run the stage tasks)
#   sg-c1/sg-c2 (10.78.0.11/.12):    slurmd + surge agent, each host with its own UTS name
#                                    (sgc1/sgc2) and its own mount namespace, so a mount the
#                                    agent of sgc1 makes is seen by sgc1's jobs only
#   sg-m1/sg-m2/sg-e3 (10.78.0.31-33, --ha only): an etcd member each (https:// client and
#                                    peer ports, client certificates required), and on m1
#                                    and m2 a surge manager (its own client certificate);
#                                    then the root netns runs no manager. An admin's query:
#     ETCDCTL_API=3 etcdctl --endpoints https://10.78.0.31:2379 --cacert $TB/etc/etcd-tls/ca.crt \
#       --cert $TB/etc/etcd-tls/etcdctl/client.crt --key $TB/etc/etcd-tls/etcdctl/client.key \
#       get /surge/leader
#
# Settings (environment): SURGE (the surge executable; default: the one on PATH, else this
# repository's target/release/surge), TB_USER (the submit user created by `up`, default
# sgbbuser), TB_DEADLINE (seconds a job's I/O waits for an unreachable server before EIO,
# default 10; surge agent's own default is 60). Slurm 22.05 from Debian (slurm-wlm, munge, lua5.3) is installed if missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TB=/run/surge-tb
export SLURM_CONF=$TB/etc/slurm.conf
TAG="# surge-tb"
COMPUTE="c1 c2"
BBS="bb1 bb2"
declare -A IP=([ctl]=10.78.0.1 [c1]=10.78.0.11 [c2]=10.78.0.12 [bb1]=10.78.0.21 [bb2]=10.78.0.22
              [m1]=10.78.0.31 [m2]=10.78.0.32 [e3]=10.78.0.33)
MANAGER=${IP[ctl]}:7060
TB_USER=${TB_USER:-sgbbuser}
# High availability (`up --ha`, remembered in $TB/ha): etcd members on m1, m2 and e3, a
# manager on m1 and one on m2; every client is given both managers.
HA_HOSTS="m1 m2 e3"
ETCD="https://${IP[m1]}:2379,https://${IP[m2]}:2379,https://${IP[e3]}:2379"
ha_on() {
    HA=1
    MANAGER=${IP[m1]}:7060,${IP[m2]}:7060
    EXTRA_HOSTS=$HA_HOSTS
}
HA=0
EXTRA_HOSTS=""
[ -e $TB/ha ] && ha_on

die() { echo "testbed: $*" >&2; exit 1; }
# pidfile -> running? (a killed daemon may linger as a zombie until reaped: not running)
alive() {
    [ -s "$1" ] || return 1
    local p; p=$(cat "$1")
    kill -0 "$p" 2>/dev/null && ! sed 's/.*) //' /proc/"$p"/stat 2>/dev/null | grep -q '^Z'
}
stop_all() { # stop_all PID...: SIGTERM to each at once, up to 10 s for all, then SIGKILL
    local left=() p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null && left+=("$p"); done
    for _ in $(seq 1 50); do
        local still=()
        for p in "${left[@]}"; do kill -0 "$p" 2>/dev/null && still+=("$p"); done
        left=("${still[@]}")
        [ ${#left[@]} = 0 ] && return 0
        sleep 0.2
    done
    kill -9 "${left[@]}" 2>/dev/null || true
}
pids_of() { # pids_of NAME...: the pids in $TB/NAME.pid that exist
    local n
    for n in "$@"; do [ -s $TB/$n.pid ] && cat $TB/$n.pid; done; true
}
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local t=$1 what=$2; shift 2
    for _ in $(seq 1 $((t * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    die "timed out after ${t}s waiting for $what"
}
surge_exe() {
    if [ -n "${SURGE:-}" ]; then echo "$SURGE"
    elif command -v surge >/dev/null; then command -v surge
    else echo "$HERE/../../target/release/surge"; fi
}
# A host's network namespace (and, for compute hosts, its mount namespace).
on() { # on HOST COMMAND...
    local h=$1; shift
    case $h in
        c*) nsenter --net=/run/netns/sg-$h --mount=$TB/ns/$h.mnt "$@" ;;
        *) nsenter --net=/run/netns/sg-$h "$@" ;;
    esac
}
# TLS (docs/SECURITY.md, "On the wire"), as a site that ran `surge cert` has it: the test bed's
# CA, and for each host a directory $TB/etc/tls/HOST with the CA and a certificate for the
# host's name and address. Every Surge process gets its host's directory (SURGE_TLS_DIR), so
# every connection between hosts (gRPC to the manager, the data protocol) is TLS 1.3; what
# runs in the root netns (the script's commands, slurmctld's hooks, jobs' submitters) has ctl's.
export SURGE_TLS_DIR=$TB/etc/tls/ctl
tls_setup() {
    local d=$TB/etc/tls h
    mkdir -p $d
    [ -s $d/ca.crt ] || $TB/bin/surge cert ca --dir $d >/dev/null
    for h in ctl $COMPUTE $BBS $EXTRA_HOSTS; do
        if [ ! -s $d/$h/server.crt ]; then
            mkdir -p $d/$h
            $TB/bin/surge cert server sg$h ${IP[$h]} --ca-cert $d/ca.crt --out $d/$h >/dev/null
            cp $d/ca.crt $d/$h/ca.crt
        fi
    done
    # Directories and the CA's certificate readable by all (the hooks run as SlurmUser);
    # ca.key and each server.key stay 0600, as `surge cert` wrote them.
    chmod 755 $d $d/*/
    chmod 644 $d/ca.crt
}
tls() { echo "SURGE_TLS_DIR=$TB/etc/tls/$1"; } # tls HOST: its processes' setting

# etcd's TLS (docs/OPERATIONS.md, "etcd with TLS"): https:// only on client and peer ports,
# and every client and peer must show a certificate of etcd's own CA, $ETLS/ca.crt (not the
# site CA, which signs every host's certificate: only what this CA signed reaches the
# managers' state). $ETLS/HOST/server.{crt,key} per member (serverAuth and clientAuth, for
# its name and address: it serves with it and dials its peers with it); client.{crt,key} in
# $ETLS/manager (both managers) and $ETLS/etcdctl (this script's etcdctl, and an admin's).
# Keys 0600, the directory 0700: root's only (etcd and the managers run as root).
ETLS=$TB/etc/etcd-tls
etcd_tls_setup() {
    local d=$ETLS h
    mkdir -p $d && chmod 700 $d
    [ -s $d/ca.crt ] || $TB/bin/surge cert ca --dir $d --name "Surge test bed etcd CA" >/dev/null
    for h in $HA_HOSTS; do
        [ -s $d/$h/server.crt ] ||
            $TB/bin/surge cert server sg$h ${IP[$h]} --peer --ca-cert $d/ca.crt --out $d/$h >/dev/null
    done
    [ -s $d/manager/client.crt ] ||
        $TB/bin/surge cert client surge-manager --ca-cert $d/ca.crt --out $d/manager >/dev/null
    [ -s $d/etcdctl/client.crt ] ||
        $TB/bin/surge cert client testbed-etcdctl --ca-cert $d/ca.crt --out $d/etcdctl >/dev/null
}
etcd_flags() { # etcd_flags HOST: a member's TLS flags
    local c=$ETLS/$1/server.crt k=$ETLS/$1/server.key
    echo --cert-file $c --key-file $k --trusted-ca-file $ETLS/ca.crt --client-cert-auth \
        --peer-cert-file $c --peer-key-file $k --peer-trusted-ca-file $ETLS/ca.crt --peer-client-cert-auth
}
etcdctl_tb() { # etcdctl_tb ARGS...: etcdctl with the CA and this script's own certificate
    ETCDCTL_API=3 etcdctl --endpoints "$ETCD" --cacert $ETLS/ca.crt \
        --cert $ETLS/etcdctl/client.crt --key $ETLS/etcdctl/client.key "$@"
}

# Start a daemon in the background with its pid in $TB/NAME.pid and its log in $TB/log.
daemon() { # daemon NAME COMMAND...
    local name=$1; shift
    alive $TB/$name.pid && return 0
    setsid "$@" </dev/null >>$TB/log/$name.log 2>&1 &
    echo $! > $TB/$name.pid
}

up() {
    [ "$(id -u)" = 0 ] || die "run as root"
    local t0; t0=$(date +%s.%N)
    if [ "${1:-}" = "--ha" ]; then
        command -v etcd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null
        ha_on
    fi
    # 0. packages
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v lua5.3 >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge lua5.3 >/dev/null
    fi
    local exe; exe=$(surge_exe)
    [ -x "$exe" ] || die "no surge executable at $exe (build it: make release, or set SURGE=)"

    # 1. runtime tree: config, logs, state, the PFS, outputs; surge where SlurmUser can run it
    mkdir -p $TB/etc $TB/log $TB/state $TB/spool/sgc1 $TB/spool/sgc2 $TB/bin $TB/ns $TB/pfs $TB/out
    [ "$HA" = 1 ] && touch $TB/ha
    chmod 755 $TB $TB/spool $TB/spool/* $TB/bin
    chmod 1777 $TB/pfs $TB/out
    install -m 755 "$exe" $TB/bin/surge
    tls_setup
    sed -e "s/@CTL_IP@/${IP[ctl]}/; s/@C1_IP@/${IP[c1]}/; s/@C2_IP@/${IP[c2]}/" \
        "$HERE/testbed/slurm.conf" > $TB/etc/slurm.conf
    install -m 644 "$HERE/burst_buffer.conf" $TB/etc/burst_buffer.conf
    sed -e "s|@SURGE@|$TB/bin/surge|; s|@MANAGER@|$MANAGER|; s|@SLURM_CONF@|$SLURM_CONF|; s|@RECONCILE_LOG@|$TB/log/surge-reconcile.log|" \
        "$HERE/burst_buffer.lua" > $TB/etc/burst_buffer.lua
    # job_submit/lua: Surge's message for a bad directive at sbatch, and the default pool for
    # a DataWarp capacity= without pool= (burst_buffer/lua ignores DefaultPool).
    sed -e "s|@SURGE@|$TB/bin/surge|; s|@DEFAULT_POOL@|nvme|" "$HERE/job_submit.lua" > $TB/etc/job_submit.lua
    chown slurm:slurm $TB/log $TB/state
    touch $TB/log/slurmctld.log && chown slurm:slurm $TB/log/slurmctld.log

    # 2. names
    [ -e $TB/hosts.orig ] || cp -p /etc/hosts $TB/hosts.orig
    [ -z "$(tail -c1 /etc/hosts)" ] || echo >> /etc/hosts
    for h in ctl c1 c2 bb1 bb2 $EXTRA_HOSTS; do
        grep -q "^${IP[$h]} sg$h $TAG\$" /etc/hosts || echo "${IP[$h]} sg$h $TAG" >> /etc/hosts
    done

    # 3. network: a bridge in the root netns, a veth per host namespace
    if ! ip link show sgbr0 >/dev/null 2>&1; then
        ip link add sgbr0 type bridge
        ip addr add ${IP[ctl]}/24 dev sgbr0
    fi
    ip link set sgbr0 up
    for h in $COMPUTE $BBS $EXTRA_HOSTS; do
        ip netns list | grep -qw "^sg-$h" || ip netns add sg-$h
        if ! ip link show sg$h >/dev/null 2>&1; then
            ip link add sg$h type veth peer name eth0 netns sg-$h
            ip link set sg$h master sgbr0
            ip -n sg-$h addr add ${IP[$h]}/24 dev eth0
        fi
        ip link set sg$h up
        ip -n sg-$h link set lo up
        ip -n sg-$h link set eth0 up
    done

    # 4. a mount namespace per compute host, kept in $TB/ns/<host>.mnt (slave: sees the
    #    machine's later mounts, its own stay its own)
    if ! mountpoint -q $TB/ns; then
        mount --bind $TB/ns $TB/ns
        mount --make-private $TB/ns
    fi
    #    Each gets its own /run/surge (a host's own /run on a real machine): mount points made
    #    by one host's agent are directories no other host sees. And its own /dev/shm: the BB
    #    hosts' fast tiers (/dev/shm/surge-tb/bbN) are not on a compute host, so its mounts
    #    reach them over the network as on a real cluster (with a shared /dev/shm they would
    #    open the servers' files directly: the local fast path).
    for h in $COMPUTE; do
        if ! nsenter --mount=$TB/ns/$h.mnt true 2>/dev/null; then
            touch $TB/ns/$h.mnt
            unshare --mount=$TB/ns/$h.mnt --propagation slave true
            nsenter --mount=$TB/ns/$h.mnt sh -c \
                'mkdir -p /run/surge && mount -t tmpfs -o mode=755,size=64m surge-run /run/surge &&
                 mount -t tmpfs -o mode=1777,size=2g surge-shm /dev/shm'
        fi
    done

    # 5. munged (Slurm and Surge both authenticate with it)
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        [ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create 2>/dev/null || \
            dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; \
            chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
        runuser -u munge -- /usr/sbin/munged
        wait_for 10 munged sh -c 'munge -n | unmunge'
        cp /run/munge/munged.pid $TB/munged.pid
    fi

    # 6. Surge: key, manager (admin group: SlurmUser's, the hooks act for the jobs' owners),
    #    servers on the BB hosts, agents on the compute hosts
    [ -s $TB/etc/surge.key ] || $TB/bin/surge key create --key-file $TB/etc/surge.key >/dev/null
    if [ "$HA" = 1 ]; then
        # etcd: three members, one per HA host, TLS with client certificates on client and
        # peer ports; then a manager on m1 and one on m2 (the first to win the election
        # serves, the other stands by without listening), each with the managers' certificate.
        etcd_tls_setup
        local cluster="e1=https://${IP[m1]}:2380,e2=https://${IP[m2]}:2380,e3=https://${IP[e3]}:2380"
        local n=1
        for h in $HA_HOSTS; do
            mkdir -p $TB/etcd
            daemon etcd-$h nsenter --net=/run/netns/sg-$h etcd --name e$n --data-dir $TB/etcd/e$n \
                --listen-client-urls https://${IP[$h]}:2379 --advertise-client-urls https://${IP[$h]}:2379 \
                --listen-peer-urls https://${IP[$h]}:2380 --initial-advertise-peer-urls https://${IP[$h]}:2380 \
                --initial-cluster "$cluster" --initial-cluster-state new --log-level warn $(etcd_flags $h)
            n=$((n + 1))
        done
        wait_for 30 "the etcd cluster" etcdctl_tb endpoint health
        for h in m1 m2; do
            daemon manager-$h nsenter --net=/run/netns/sg-$h env $(tls $h) $TB/bin/surge manager --etcd "$ETCD" \
                --etcd-ca $ETLS/ca.crt --etcd-cert $ETLS/manager/client.crt --etcd-key $ETLS/manager/client.key \
                --name $h --listen ${IP[$h]}:7060 \
                --key-file $TB/etc/surge.key --admin-group "$(id -g slurm)" --pool nvme \
                --granularity 64MiB --mount-root /run/surge/jobs
        done
    else
        daemon manager env $(tls ctl) $TB/bin/surge manager --state $TB/state-surge/manager.db --listen $MANAGER \
            --key-file $TB/etc/surge.key --admin-group "$(id -g slurm)" --pool nvme \
            --granularity 64MiB --mount-root /run/surge/jobs
    fi
    wait_for 20 "the surge manager" $TB/bin/surge pool --manager $MANAGER ls
    for b in $BBS; do
        mkdir -p /dev/shm/surge-tb/$b
        daemon server-$b nsenter --net=/run/netns/sg-$b env $(tls $b) $TB/bin/surge server --device /dev/shm/surge-tb/$b --capacity 4GiB \
            --listen 0.0.0.0:7070 --advertise ${IP[$b]}:7070 --manager $MANAGER --pool nvme \
            --key-file $TB/etc/surge.key
    done
    wait_for 20 "2 servers up in pool nvme" sh -c \
        "$TB/bin/surge pool --manager $MANAGER ls --json | grep -Eq '\"servers_up\": *2'"
    # Data movers on the BB hosts (they see the PFS): the manager only schedules stage tasks.
    for b in $BBS; do
        daemon mover-$b nsenter --net=/run/netns/sg-$b env $(tls $b) $TB/bin/surge mover --manager $MANAGER --host sg$b
    done
    for c in $COMPUTE; do
        daemon agent-$c nsenter --net=/run/netns/sg-$c --mount=$TB/ns/$c.mnt env $(tls $c) $TB/bin/surge agent --manager $MANAGER --host sg$c \
            --deadline "${TB_DEADLINE:-10}"
    done

    # 7. Slurm: slurmctld (UTS name sgctl), a slurmd per compute host in its namespaces
    if ! alive $TB/slurmctld.pid; then
        unshare --uts sh -c 'hostname sgctl && exec /usr/sbin/slurmctld'
    fi
    for c in $COMPUTE; do
        if ! alive $TB/slurmd.sg$c.pid; then
            on $c unshare --uts sh -c "hostname sg$c && exec /usr/sbin/slurmd"
        fi
    done

    # 8. the submit user (root may not use burst buffers)
    if ! id "$TB_USER" >/dev/null 2>&1; then
        useradd -m -s /bin/bash "$TB_USER"
        echo "$TB_USER" > $TB/user.created
    fi

    wait_for 30 "both compute nodes up" sh -c '[ "$(sinfo -h -N -t idle,alloc,mix,comp -o %N | sort -u | wc -l)" -ge 2 ]'
    wait_for 20 "both agents alive" sh -c \
        "[ \$($TB/bin/surge bb agents --manager $MANAGER | grep -c ' alive') -ge 2 ]"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "testbed up in %.1f s; export SLURM_CONF=%s SURGE_MANAGER=%s\n", b-a, "'$SLURM_CONF'", "'$MANAGER'"}'
}

down() {
    [ "$(id -u)" = 0 ] || die "run as root"
    [ -f $SLURM_CONF ] && timeout 10 scancel --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    # In tiers, each tier's daemons at once: Slurm, then what mounts and stages, then the
    # servers, the managers, etcd.
    local c b h
    stop_all $(pids_of $(for c in $COMPUTE; do echo slurmd.sg$c; done) slurmctld)
    stop_all $(pids_of $(for c in $COMPUTE; do echo agent-$c; done) $(for b in $BBS; do echo mover-$b; done))
    stop_all $(pids_of $(for b in $BBS; do echo server-$b; done))
    stop_all $(pids_of manager $(for h in $HA_HOSTS; do echo manager-$h; done))
    stop_all $(pids_of $(for h in $HA_HOSTS; do echo etcd-$h; done))
    # Anything left inside the host namespaces (slurmstepd, job tasks).
    local left=()
    for h in $COMPUTE $BBS $HA_HOSTS; do
        if ip netns list | grep -qw "^sg-$h"; then left+=($(ip netns pids sg-$h)); fi
    done
    stop_all "${left[@]}"
    # FUSE mounts left in the compute hosts' mount namespaces, then the namespaces.
    for c in $COMPUTE; do
        if [ -e $TB/ns/$c.mnt ] && nsenter --mount=$TB/ns/$c.mnt true 2>/dev/null; then
            nsenter --mount=$TB/ns/$c.mnt sh -c \
                'grep " /run/surge/" /proc/self/mountinfo | cut -d" " -f5 | sort -r | xargs -r -n1 umount -l' || true
            umount $TB/ns/$c.mnt 2>/dev/null || true
        fi
    done
    mountpoint -q $TB/ns && umount $TB/ns
    stop_all $(pids_of munged)
    for h in $COMPUTE $BBS $HA_HOSTS; do
        ip link del sg$h 2>/dev/null || true
        if ip netns list | grep -qw "^sg-$h"; then ip netns del sg-$h; fi
    done
    ip link del sgbr0 2>/dev/null || true
    if grep -q " $TAG\$" /etc/hosts; then
        local tmp; tmp=$(mktemp)
        grep -v " $TAG\$" /etc/hosts > "$tmp"; cat "$tmp" > /etc/hosts; rm -f "$tmp"
    fi
    if [ -s $TB/user.created ]; then userdel -r "$(cat $TB/user.created)" 2>/dev/null || true; fi
    rm -rf $TB /dev/shm/surge-tb
    echo "testbed down"
}

# Submit SCRIPT as USER from the submit host, wait until the job has left the queue, print
# its final state, exit code and output file.
submit() {
    local user=$1 script=$2; shift 2
    local id
    id=$(runuser -u "$user" -- env SLURM_CONF=$SLURM_CONF sbatch --parsable \
        --output=$TB/out/%j.out -D $TB/pfs "$@" "$script") || return 1
    id=${id%%;*}
    local state=""
    for _ in $(seq 1 900); do
        state=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        case $state in
            COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) break ;;
        esac
        sleep 0.2
    done
    # The burst buffer is torn down after the job's state is final: wait for the teardown.
    for _ in $(seq 1 300); do
        squeue -h -j "$id" 2>/dev/null | grep -q . || break
        sleep 0.2
    done
    local code
    code=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p')
    echo "job $id $state ${code:-?} $TB/out/$id.out"
}

status() {
    if [ "$HA" = 1 ]; then
        # Who leads: the leader record in etcd ({"name", "pid", "grpc", ...}).
        local l
        l=$(etcdctl_tb get /surge/leader --print-value-only 2>/dev/null || true)
        if [ -n "$l" ]; then
            echo "$l" | sed -n 's/.*"name":"\([^"]*\)".*"pid":\([0-9]*\).*/manager \1 leader pid \2/p'
        else
            echo "manager none leader (no leader record in etcd)"
        fi
        for h in m1 m2; do
            alive $TB/manager-$h.pid && echo "manager $h pid $(cat $TB/manager-$h.pid)"
        done
    fi
    sinfo -N 2>/dev/null || true
    $TB/bin/surge session --manager $MANAGER ls || true
    $TB/bin/surge bb agents --manager $MANAGER || true
    $TB/bin/surge pool --manager $MANAGER ls || true
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    sbatch) shift; [ $# -ge 2 ] || die "usage: testbed.sh sbatch USER SCRIPT [SBATCH-ARGS...]"; submit "$@" ;;
    status) status ;;
    *) sed -n '2,25p' "$0"; exit 2 ;;
esac
