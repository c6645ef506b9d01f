#!/usr/bin/env bash
# xfstests (fstests, the Linux file-system QA suite) against tmpfs, Surge and bindfs on this
# machine, and what passes elsewhere but fails on Surge.
#
#   tests/xfstests/run.sh [--fs tmpfs,local,striped,bindfs] [--list FILE | --tests "generic/001 ..."
#                          | --group quick] [--out DIR]
#
# - tmpfs: the yardstick (docs/SEMANTICS.md "What still differs from tmpfs").
# - local: what a plain `surge run` job gets: 2 servers on this host, each new file one stripe on
#   a fragment of this host, read and written by the kernel (passthrough, as root).
# - striped: the same servers, every file striped over both fragments (DataWarp's layout: every
#   byte through the daemon).
# - bindfs: a reference FUSE file system (Debian's bindfs over a directory of this machine).
#
# Surge and bindfs are mounted by mount(8) through `mount.fuse.surge` (the `surge` binary under
# test, linked as /sbin/mount.fuse.surge for the run) and `tests/xfstests/mount.fuse.bindfs`;
# whatever was at those paths before is put back at the end.
#
# Default list: tests/xfstests/quick.list (the `generic/` tests of the `quick` group that need
# no dm/loop/block devices, quotas, reflinks, shutdown, freeze or extra users). Prints per file
# system the pass, fail and not-run lists, and the tests that pass on tmpfs (and on bindfs) but
# fail on Surge; writes them under --out (default bench/out/xfstests-<time>). Exits 1 when a test
# passing on tmpfs or bindfs fails on Surge, except those in tests/xfstests/expected-differences
# (each with its reason; docs/SEMANTICS.md). Needs root and /dev/fuse.
#
# xfstests comes from ../shared/tools/fs-suites/xfstests-full.tar.gz (or $SURGE_FS_SUITES),
# built once into .tools/xfstests (`make setup` does it; apt packages in scripts/setup.sh).
# The surge binary: $SURGE, else $CARGO_TARGET_DIR or target/, release then debug.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
fss=tmpfs,local,striped,bindfs
list=$here/quick.list
tests=""
group=""
out=""
while [ $# -gt 0 ]; do
    case $1 in
        --fs) fss=$2; shift 2 ;;
        --list) list=$2; shift 2 ;;
        --tests) tests=$2; shift 2 ;;
        --group) group=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "run.sh: xfstests mounts and unmounts: run as root" >&2; exit 2; }
[ -c /dev/fuse ] || { echo "run.sh: /dev/fuse is missing" >&2; exit 2; }
command -v bindfs >/dev/null || [[ ",$fss," != *,bindfs,* ]] \
    || { echo "run.sh: bindfs is missing (apt-get install bindfs) or leave it out of --fs" >&2; exit 2; }

# The xfstests tree, built once.
xfs=${XFSTESTS_DIR:-$root/.tools/xfstests}
if [ ! -x "$xfs/check" ] || [ ! -x "$xfs/src/open_by_handle" ]; then
    suites=${SURGE_FS_SUITES:-$root/../shared/tools/fs-suites}
    [ -f "$suites/xfstests-full.tar.gz" ] \
        || { echo "run.sh: $suites/xfstests-full.tar.gz is missing (set SURGE_FS_SUITES)" >&2; exit 2; }
    echo "run.sh: building xfstests into $xfs (a few minutes)"
    mkdir -p "$(dirname "$xfs")"
    rm -rf "$xfs" && tar -xzf "$suites/xfstests-full.tar.gz" -C "$(dirname "$xfs")"
    [ "$(dirname "$xfs")/xfstests" = "$xfs" ] || mv "$(dirname "$xfs")/xfstests" "$xfs"
    make -C "$xfs" -j"$(nproc)" >"$xfs.build.log" 2>&1 \
        || { echo "run.sh: building xfstests failed, see $xfs.build.log" >&2; exit 2; }
fi

# xfstests has no way to size a FUSE file system (`_scratch_mkfs_sized`: "Filesystem fuse not
# supported"). Its tmpfs case makes a new file system of that size at the next mount; this adds
# the same for a FUSE section that names a command for it ($FUSE_MKFS_SIZED, which prints the
# scratch mount options: tests/xfstests/mkfs-sized for Surge). Sections without one (bindfs)
# still do not run those tests.
if ! grep -q FUSE_MKFS_SIZED "$xfs/common/rc"; then
    perl -0pi -e 's/(\t\*\)\n\t\t_notrun "Filesystem \$FSTYP not supported in _scratch_mkfs_sized")/\tfuse)\n\t\t# Added by Surge'"'"'s tests\/xfstests\/run.sh.\n\t\t[ -n "\$FUSE_MKFS_SIZED" ] || _notrun "Filesystem \$FSTYP\$FUSE_SUBTYP not supported in _scratch_mkfs_sized"\n\t\tlocal sized_opts\n\t\tsized_opts=\$(\$FUSE_MKFS_SIZED "\$fssize") || return 1\n\t\texport MOUNT_OPTIONS="\$sized_opts"\n\t\t;;\n$1/' "$xfs/common/rc"
    grep -q FUSE_MKFS_SIZED "$xfs/common/rc" \
        || { echo "run.sh: could not add the fuse case to $xfs/common/rc's _try_scratch_mkfs_sized" >&2; exit 2; }
fi

surge=${SURGE:-}
if [ -z "$surge" ]; then
    for t in "${CARGO_TARGET_DIR:-$root/target}"/{release,debug}/surge; do
        [ -x "$t" ] && { surge=$t; break; }
    done
fi
[ -x "$surge" ] || { echo "run.sh: no surge binary (cargo build -p surge-cli, or set SURGE)" >&2; exit 2; }
surge=$(readlink -f "$surge")

# One run at a time on a host: the mount helpers in /sbin are the host's.
exec 9>/run/lock/surge-xfstests.lock
flock -n 9 || { echo "run.sh: another run holds /run/lock/surge-xfstests.lock; waiting for it"; flock 9; }

out=${out:-$root/bench/out/xfstests-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/surge-xfstests.XXXXXX")
pids=()
tiers=()
saved=()

# Puts a mount helper in place for the run, keeping what was there.
install_helper() { # NAME TARGET
    local p=/sbin/$1
    if [ -e "$p" ] || [ -L "$p" ]; then
        mv "$p" "$work/saved.$1"
        saved+=("$1")
    fi
    ln -s "$2" "$p"
}

cleanup() {
    set +e
    for m in $(findmnt -rn -o TARGET | grep "^$work/" | sort -r); do umount "$m" 2>/dev/null || umount -l "$m"; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ "$(readlink /sbin/mount.fuse.surge)" = "$surge" ] && rm -f /sbin/mount.fuse.surge
    [ "$(readlink /sbin/mount.fuse.bindfs)" = "$here/mount.fuse.bindfs" ] && rm -f /sbin/mount.fuse.bindfs
    for h in "${saved[@]}"; do mv "$work/saved.$h" "/sbin/$h"; done
    rm -rf "$work" "${tiers[@]}"
}
trap cleanup EXIT

install_helper mount.fuse.surge "$surge"
install_helper mount.fuse.bindfs "$here/mount.fuse.bindfs"

# Two Surge servers on this host (one cluster for both kinds), as `surge run` starts them:
# their fast tier in /dev/shm (tmpfs) where there is one.
cluster() {
    local tier=$work
    [ -d /dev/shm ] && tier=$(mktemp -d /dev/shm/surge-xfstests.XXXXXX) && tiers+=("$tier")
    export SURGE_KEY_FILE=$work/surge.key
    "$surge" key create --key-file "$SURGE_KEY_FILE" >/dev/null
    local addrs=() i
    for i in 0 1; do
        "$surge" server --device "$tier/bb$i" --capacity 16GiB --listen 127.0.0.1:0 \
            --unix "$work/bb$i.sock" --ready-file "$work/bb$i.ready" 2>"$out/server$i.log" &
        pids+=($!)
    done
    for i in 0 1; do
        for _ in $(seq 200); do [ -s "$work/bb$i.ready" ] && break; sleep 0.1; done
        addrs+=("$(jq -r '.addrs[] | select(startswith("unix:") | not)' "$work/bb$i.ready")")
    done
    servers=$(IFS=,; echo "${addrs[*]}")
}
instance() {
    "$surge" instance create --servers "$servers" --capacity 4GiB --stripe-size 8MiB --json \
        | jq -r .instance
}

# One config file per section: xfstests takes a config's first section as every later one's
# defaults and "recreates" the test file system of a section whose FSTYP differs from the
# first's, which a FUSE section after tmpfs (or tmpfs after one) cannot survive (bindfs ran no
# test after tmpfs). Each run reads only its own.
# Each section sets FUSE_MKFS_SIZED, empty where it cannot size its scratch file system.
section() { # NAME TEST_DEV SCRATCH_DEV FSTYP SUBTYPE TEST_OPTS SCRATCH_OPTS [MORE]
    mkdir -p "$work/mnt/$1-test" "$work/mnt/$1-scratch"
    cat >"$work/$1.config" <<EOF
[$1]
FSTYP=$4
FUSE_SUBTYP=$5
TEST_DEV=$2
TEST_DIR=$work/mnt/$1-test
SCRATCH_DEV=$3
SCRATCH_MNT=$work/mnt/$1-scratch
TEST_FS_MOUNT_OPTS="$6"
MOUNT_OPTIONS="$7"
FUSE_MKFS_SIZED=
${8:-}

EOF
}

servers=""
IFS=, read -ra want <<<"$fss"
for fs in "${want[@]}"; do
    case $fs in
        tmpfs) section tmpfs xt_tmpfs_test xt_tmpfs_scratch tmpfs "" "" "" ;;
        local|striped)
            [ -n "$servers" ] || cluster
            common="server=unix:$work/bb0.sock,key_file=$SURGE_KEY_FILE"
            [ "$fs" = striped ] && common="$common,layout=stripe_count=all"
            t=$(instance) s=$(instance)
            section "$fs" "surge_${fs}_test" "surge_${fs}_scratch" fuse .surge \
                "-o $common,instance=$t,log=$out/mount-$fs-test.log" \
                "-o $common,instance=$s,log=$out/mount-$fs-scratch.log" \
                "FUSE_MKFS_SIZED=$here/mkfs-sized
SURGE_BIN=$surge
SURGE_SERVERS=$servers
SURGE_KEY_FILE=$SURGE_KEY_FILE
SURGE_SIZED_OPTS=$common,log=$out/mount-$fs-scratch.log
SURGE_SIZED_STATE=$work/sized-$fs" ;;
        bindfs)
            mkdir -p "$work/bindfs-test" "$work/bindfs-scratch"
            section bindfs "$work/bindfs-test" "$work/bindfs-scratch" fuse .bindfs \
                "-o allow_other,default_permissions" "-o allow_other,default_permissions" \
                "UMOUNT_PROG=$here/umount-by-source" ;;
        *) echo "run.sh: unknown file system $fs (tmpfs, local, striped, bindfs)" >&2; exit 2 ;;
    esac
done

if [ -n "$group" ]; then
    sel=(-g "$group")
elif [ -n "$tests" ]; then
    read -ra sel <<<"$tests"
else
    mapfile -t sel < <(grep -v '^#' "$list" | grep .)
fi

# One section at a time: its lists in $out/<fs>.{pass,fail,notrun}.
for fs in "${want[@]}"; do
    echo "== $fs: ${#sel[@]} tests ($(date +%T))"
    start=$(date +%s)
    (cd "$xfs" && HOST_OPTIONS=$work/$fs.config RESULT_BASE=$out/results timeout 3h ./check -s "$fs" "${sel[@]}") \
        >"$out/$fs.log" 2>&1 || true
    field() { sed -n "s/^$1: //p" "$out/$fs.log" | tail -1 | tr ' ' '\n' | grep . | sort -u || true; }
    field Ran >"$out/$fs.ran"
    field Failures >"$out/$fs.fail"
    field "Not run" >"$out/$fs.notrun"
    # "Ran:" lists the tests not run too.
    sort -u "$out/$fs.fail" "$out/$fs.notrun" | comm -23 "$out/$fs.ran" - >"$out/$fs.pass"
    printf '%s: %d pass, %d fail, %d not run (%ds; log %s)\n' "$fs" "$(wc -l <"$out/$fs.pass")" \
        "$(wc -l <"$out/$fs.fail")" "$(wc -l <"$out/$fs.notrun")" $(($(date +%s) - start)) "$out/$fs.log"
    for k in fail notrun; do echo "  $k: $(tr '\n' ' ' <"$out/$fs.$k")"; done
    # Leave nothing mounted for the next section.
    for m in $(findmnt -rn -o TARGET | grep "^$work/mnt/$fs-" | sort -r); do umount "$m" 2>/dev/null || umount -l "$m"; done
done

# Differences, and whether each is one SEMANTICS.md explains.
expected=$here/expected-differences
status=0
for ref in tmpfs bindfs; do
    [ -f "$out/$ref.pass" ] || continue
    for fs in local striped; do
        [ -f "$out/$fs.pass" ] || continue
        comm -23 "$out/$ref.pass" "$out/$fs.pass" >"$out/$ref-not-$fs"
        echo "passes on $ref but not on Surge $fs: $(tr '\n' ' ' <"$out/$ref-not-$fs")"
        while read -r t; do
            why=$(grep -E "^$t( |$)" "$expected" 2>/dev/null | cut -d' ' -f2- || true)
            if [ -n "$why" ]; then
                echo "  $t: expected ($why)"
            else
                grep -qx "$t" "$out/$fs.fail" && echo "  $t: FAILS on Surge $fs" || echo "  $t: not run on Surge $fs"
                status=1
            fi
        done <"$out/$ref-not-$fs"
    done
done
echo "results: $out"
exit $status
