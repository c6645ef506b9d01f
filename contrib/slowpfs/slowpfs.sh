#!/bin/bash
# slowpfs.sh — a throttled "slow parallel file system" directory on one machine, for
# benchmarks of Surge's write-behind cache (drain to the PFS) and of stage in/out.
#
#   slowpfs.sh up     [--dir DIR] [--size SIZE] [--write-mbps N] [--read-mbps N] [--iops N]
#                     [--max-dirty MIB] [--fs auto|xfs|ext4]
#   slowpfs.sh down   [--dir DIR]
#   slowpfs.sh status [--dir DIR] [--json]
#   slowpfs.sh probe  [--dir DIR] [--mib N] [--json]
#   slowpfs.sh exec   CMD [ARGS...]
#
# What `up` builds (see README.md next to this file for the measurements behind each choice):
#
#   /var/tmp/surge-slowpfs/<id>.img   sparse image on the real disk (never tmpfs: a memory-backed
#        |                            image would make the "PFS" as fast as the burst buffer)
#   /dev/loopN  (--direct-io=on)      the loop worker reads/writes the image with O_DIRECT, so the
#        |                            image is not cached a second time in the page cache
#   XFS (ext4 if no mkfs.xfs)         mounted at DIR, mode 1777 (like /tmp: any user can write)
#
#   Throttle: cgroup-v1 blkio limits on the loop device's MAJ:MIN, set in the ROOT blkio cgroup
#   (/sys/fs/cgroup/blkio/blkio.throttle.{write,read}_{bps,iops}_device). Measured on this kernel
#   (6.18, cgroup v1 blkio, no cgroup writeback):
#     - the root-cgroup rule throttles every process that is in the root blkio cgroup (on this VM:
#       all of them) for O_DIRECT writes and reads, buffered writes + fsync and buffered reads;
#     - it also throttles background writeback of buffered writes, because the flusher threads
#       are kernel threads and live in the root cgroup;
#     - a per-bdi dirty cap (--max-dirty, default 64 MiB, with strict_limit) makes even buffered
#       writes WITHOUT fsync slow down to the device rate after 64 MiB instead of filling GiBs of
#       page cache at memory speed;
#     - a rule in a CHILD blkio cgroup only throttles the processes in that child (v1 blkio is
#       flat, not hierarchical), and the loop workers (kworker/uN:M-loopN) cannot be moved into
#       a cgroup (EINVAL); the loop driver charges the backing-file I/O to the cgroup of the
#       original writer anyway.
#   LIMITATION: a process that sits in a non-root blkio cgroup (systemd services, containers) is
#   NOT throttled for its O_DIRECT writes and its reads (measured: 1.2 GB/s). Its buffered writes,
#   with or without fsync, still are (about 210 MiB/s against 200), because the dirty cap makes it
#   wait for the throttled writeback. `slowpfs.sh exec CMD` moves itself into the root blkio
#   cgroup and runs CMD there; `status` counts the processes that are outside it.
#
# Units: --write-mbps/--read-mbps are MiB/s (2^20 bytes per second), 0 = unlimited.
# --iops applies to reads and to writes, 0 = unlimited. SIZE takes K/M/G/T suffixes (binary).
# Environment: SLOWPFS_IMAGE_DIR overrides /var/tmp/surge-slowpfs (must not be tmpfs/ramfs).
# Needs root for up/down/exec (loop devices, mount, cgroups); status and probe work for anyone.
set -euo pipefail
export LC_ALL=C

PROG=slowpfs
DEFAULT_DIR=/run/surge-slowpfs/pfs
STATE_DIR=/run/surge-slowpfs/instances       # one <id>.conf per instance (tmpfs: gone at reboot)
IMAGE_DIR=${SLOWPFS_IMAGE_DIR:-/var/tmp/surge-slowpfs}
CG=/sys/fs/cgroup/blkio                       # root of the cgroup-v1 blkio hierarchy
MIB=1048576

die() { echo "$PROG: error: $*" >&2; exit 1; }
warn() { echo "$PROG: warning: $*" >&2; }
info() { echo "$PROG: $*" >&2; }

usage() {
    cat <<'EOF'
slowpfs.sh — a throttled "slow PFS" directory (loop device + XFS/ext4 + cgroup-v1 blkio limits)

  slowpfs.sh up [options]      create, mount and throttle (idempotent; with new limits: re-throttle)
      --dir DIR                mount point (default /run/surge-slowpfs/pfs); it gets mode 1777
      --size SIZE              sparse image size, e.g. 4G, 512M (default 4G); image lives in
                               /var/tmp/surge-slowpfs (env SLOWPFS_IMAGE_DIR), never on tmpfs
      --write-mbps N           write limit in MiB/s (default 200; 0 = unlimited)
      --read-mbps N            read limit in MiB/s (default 400; 0 = unlimited)
      --iops N                 read and write IOPS limit each (default 0 = unlimited)
      --max-dirty MIB          dirty page-cache cap of the device, so buffered writes without
                               fsync feel the limit too (default 64; 0 = kernel default, GiBs)
      --fs auto|xfs|ext4       file system (default auto: XFS if mkfs.xfs exists and SIZE >= 512M)
  slowpfs.sh down [--dir DIR]  unmount, detach, clear the limits, remove image and state (idempotent)
  slowpfs.sh status [--dir DIR] [--json]
                               configuration and kernel state of all instances (or of DIR)
  slowpfs.sh probe [--dir DIR] [--mib N] [--json]
                               measure sequential write (buffered+fsync and O_DIRECT) and read
                               (O_DIRECT, and buffered after dropping the file's cache) with dd,
                               N MiB each (default 512); JSON: {"write_mib_s":..,"read_mib_s":..,...}
  slowpfs.sh exec CMD [ARGS]   run CMD in the root blkio cgroup, where the limits apply (only needed
                               for a caller that sits in a child blkio cgroup, see below)

How the throttle works: blkio.throttle.* rules for the loop device's MAJ:MIN in the ROOT blkio
cgroup. Every process in the root blkio cgroup (normally all of them, root or not) and the kernel's
writeback threads are throttled: O_DIRECT, buffered+fsync, buffered (via the dirty cap) and reads.
Processes in a child blkio cgroup are NOT throttled for their O_DIRECT I/O and reads (cgroup-v1
blkio is flat; their buffered writes are, through the dirty cap); run them through `slowpfs.sh exec`.
Metadata operations are not slowed (no latency is added).
EOF
}

# ---------------------------------------------------------------- helpers

need_root() { [ "$(id -u)" -eq 0 ] || die "'$1' needs root (loop devices, mount, cgroups)"; }

# A non-negative decimal integer, or die naming the option.
need_uint() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 wants a non-negative integer, got '$2'"; }

# SIZE with optional K/M/G/T (binary) suffix, optional "iB"/"B" -> bytes.
parse_size() {
    local s=$1 n u
    [[ $s =~ ^([0-9]+)([KkMmGgTt]?)(i?B)?$ ]] || die "--size wants e.g. 4G or 512M, got '$s'"
    n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]}
    case $u in
        '') echo "$n" ;;
        [Kk]) echo $((n << 10)) ;;
        [Mm]) echo $((n << 20)) ;;
        [Gg]) echo $((n << 30)) ;;
        [Tt]) echo $((n << 40)) ;;
    esac
}

# Canonical absolute path (need not exist); the instance id is derived from it.
canon() { realpath -m -- "$1"; }

# Instance id: the path with odd characters replaced, plus a checksum against collisions.
inst_id() {
    local d=$1 s c
    s=$(printf '%s' "${d#/}" | tr -c 'A-Za-z0-9._-' '_')
    c=$(printf '%s' "$d" | cksum | cut -d' ' -f1)
    echo "${s:-root}-$c"
}

# State file: key=value lines. load_state FILE fills the associative array ST.
declare -A ST=()
load_state() {
    ST=()
    local k v
    [ -f "$1" ] || return 1
    while IFS='=' read -r k v; do
        [ -n "$k" ] && ST[$k]=$v
    done <"$1"
    return 0
}
save_state() { # save_state FILE (from ST)
    local f=$1 k tmp
    mkdir -p "$STATE_DIR"
    tmp=$(mktemp "$STATE_DIR/.tmp.XXXXXX")
    for k in $(printf '%s\n' "${!ST[@]}" | sort); do printf '%s=%s\n' "$k" "${ST[$k]}"; done >"$tmp"
    chmod 644 "$tmp"                 # status is for everyone
    mv -f "$tmp" "$f"
}

# blkio rule for MAJ:MIN in a root-cgroup throttle file (bytes/s or IOPS), 0 if none.
blk_get() { awk -v d="$2" '$1 == d { print $2; f = 1 } END { if (!f) print 0 }' "$CG/$1"; }
# Set (or, with 0, clear) a rule; writes only when it differs, so a repeated `up` changes nothing.
blk_set() {
    local file=$1 dev=$2 val=$3
    [ "$(blk_get "$file" "$dev")" = "$val" ] && return 0
    echo "$dev $val" >"$CG/$file" 2>/dev/null || die "cannot write '$dev $val' to $CG/$file"
}
apply_limits() { # MAJ:MIN WRITE_MIBS READ_MIBS IOPS
    blk_set blkio.throttle.write_bps_device "$1" $(($2 * MIB))
    blk_set blkio.throttle.read_bps_device "$1" $(($3 * MIB))
    blk_set blkio.throttle.write_iops_device "$1" "$4"
    blk_set blkio.throttle.read_iops_device "$1" "$4"
}
clear_limits() { apply_limits "$1" 0 0 0; }

# Dirty page-cache cap of the loop device's bdi (/sys/class/bdi/MAJ:MIN). The bdi and the blkio
# rules both outlive `losetup -d` (the loop device node stays), so `down` must reset them.
bdi_apply() { # MAJ:MIN MAX_DIRTY_MIB (0 = reset to kernel defaults)
    local b=/sys/class/bdi/$1 want
    [ -d "$b" ] || { warn "no $b: --max-dirty ignored"; return 0; }
    if [ "$2" -eq 0 ]; then
        [ "$(cat "$b/max_ratio")" = 100 ] || echo 100 >"$b/max_ratio" || die "cannot write 100 to $b/max_ratio"
        if [ -e "$b/strict_limit" ] && [ "$(cat "$b/strict_limit")" != 0 ]; then
            echo 0 >"$b/strict_limit" || die "cannot write 0 to $b/strict_limit"
        fi
        return 0
    fi
    if [ ! -e "$b/max_bytes" ] || [ ! -e "$b/strict_limit" ]; then
        warn "kernel has no $b/max_bytes or strict_limit: --max-dirty ignored"; return 0
    fi
    # The kernel stores the cap as a fraction of the global dirty limit, so read-back differs
    # slightly from what was written: compare with 1 % tolerance for idempotence.
    want=$(($2 * MIB))
    local have; have=$(cat "$b/max_bytes")
    if [ $((have > want ? have - want : want - have)) -gt $((want / 100 + 4096)) ]; then
        echo "$want" >"$b/max_bytes" 2>/dev/null || die "cannot write $want to $b/max_bytes"
    fi
    [ "$(cat "$b/strict_limit")" = 1 ] || echo 1 >"$b/strict_limit" || die "cannot write 1 to $b/strict_limit"
}

# Loop devices attached to IMAGE (one per line).
loops_of() { [ -e "$1" ] || return 0; losetup -n -O NAME -j "$1" 2>/dev/null || true; }
majmin_of() { cat "/sys/block/${1#/dev/}/dev"; }
mount_source() { findmnt -n -o SOURCE --mountpoint "$1" 2>/dev/null || true; }

# Number of processes whose blkio cgroup is not the root (their own I/O escapes the limits).
escaping_procs() {
    local n=0 f line
    for f in /proc/[0-9]*/cgroup; do
        line=$(grep -m1 -E '^[0-9]+:([^:]*,)?blkio(,[^:]*)?:' "$f" 2>/dev/null) || continue
        [ "${line##*:}" = / ] || n=$((n + 1))
    done
    echo "$n"
}

lock() { # serialize up/down (flock on this script file: no lock file to leave behind)
    exec 9<"${BASH_SOURCE[0]}"
    flock -w 120 9 || die "another slowpfs.sh up/down is still running (waited 120 s)"
}

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

# ---------------------------------------------------------------- option parsing

DIR=$DEFAULT_DIR DIR_SET=0 SIZE=4G WMBPS=200 RMBPS=400 IOPS=0 MAXDIRTY=64 FS=auto JSON=0 PMIB=512
parse_opts() { # parse_opts ALLOWED-OPTIONS... -- ARGS...
    local allowed=" " a
    while [ "$1" != -- ]; do allowed+="$1 "; shift; done
    shift
    while [ $# -gt 0 ]; do
        a=$1
        [[ $allowed == *" ${a%%=*} "* ]] || die "unknown option '$a' for '$CMD' (see --help)"
        if [[ $a == --*=* ]]; then set -- "${a%%=*}" "${a#*=}" "${@:2}"; a=$1; fi
        case $a in
            --json) JSON=1; shift; continue ;;
            -h | --help) usage; exit 0 ;;
        esac
        [ $# -ge 2 ] || die "option '$a' needs a value"
        case $a in
            --dir) DIR=$2; DIR_SET=1 ;;
            --size) SIZE=$2 ;;
            --write-mbps) need_uint "$a" "$2"; WMBPS=$((10#$2)) ;;
            --read-mbps) need_uint "$a" "$2"; RMBPS=$((10#$2)) ;;
            --iops) need_uint "$a" "$2"; IOPS=$((10#$2)) ;;
            --max-dirty) need_uint "$a" "$2"; MAXDIRTY=$((10#$2)) ;;
            --mib) need_uint "$a" "$2"; PMIB=$((10#$2)); [ "$PMIB" -gt 0 ] || die "--mib must be > 0" ;;
            --fs) case $2 in auto | xfs | ext4) FS=$2 ;; *) die "--fs wants auto, xfs or ext4, got '$2'" ;; esac ;;
        esac
        shift 2
    done
    [ -n "$DIR" ] || die "--dir is empty"
    DIR=$(canon "$DIR")
    [ "$DIR" != / ] || die "--dir / is not allowed"
}

# Paths of the instance at $DIR.
set_paths() {
    ID=$(inst_id "$DIR")
    STATE=$STATE_DIR/$ID.conf
    IMG=$IMAGE_DIR/$ID.img
}

# ---------------------------------------------------------------- down

# Take down whatever exists of the instance at $DIR (state file, mount, loop devices, limits,
# image, created directories). Safe to run on a half-built or already removed instance.
teardown() {
    local src l dev had_state=0
    load_state "$STATE" && had_state=1
    local img=${ST[image]:-$IMG}
    src=$(mount_source "$DIR")
    # Loop devices to detach: those attached to the image, and the one mounted at DIR if it
    # is one of ours (a mount of something else at DIR is left alone).
    local loops; loops=$(loops_of "$img")
    if [ -n "$src" ]; then
        if printf '%s\n' "$loops" | grep -qxF -- "$src"; then
            # Lift the throttle first, so flushing the dirty data at umount is not throttled.
            dev=$(majmin_of "$src")
            clear_limits "$dev"
            if ! umount "$DIR" 2>/dev/null; then
                sleep 1
                if ! umount "$DIR"; then
                    [ "$had_state" = 1 ] && apply_limits "$dev" "${ST[write_mibs]}" "${ST[read_mibs]}" "${ST[iops]}"
                    die "umount $DIR failed (busy? see: fuser -vm $DIR); the instance is still up"
                fi
            fi
        else
            [ "$had_state" = 1 ] && warn "$DIR is mounted from '$src', not from this instance's image: left mounted"
        fi
    fi
    for l in $loops; do
        dev=$(majmin_of "$l")
        clear_limits "$dev"
        bdi_apply "$dev" 0
        losetup -d "$l" || die "losetup -d $l failed"
    done
    # The loop device recorded in the state may already be detached: its rules and bdi settings
    # would survive and apply to the next user of that device number, so reset them too.
    if [ -n "${ST[majmin]:-}" ] && [ -d "/sys/class/bdi/${ST[majmin]}" ]; then
        clear_limits "${ST[majmin]}"
        bdi_apply "${ST[majmin]}" 0
    fi
    rm -f -- "$img"
    # Directories that `up` created for the mount point (from DIR up to the topmost new one).
    if [ -n "${ST[created_top]:-}" ]; then
        local d=$DIR
        while :; do
            rmdir -- "$d" 2>/dev/null || break
            [ "$d" = "${ST[created_top]}" ] && break
            d=$(dirname -- "$d")
        done
    fi
    rm -f -- "$STATE"
    rmdir -- "$STATE_DIR" 2>/dev/null || true
    rmdir -- "$(dirname -- "$STATE_DIR")" 2>/dev/null || true
    rmdir -- "$IMAGE_DIR" 2>/dev/null || true
}

cmd_down() {
    need_root down
    set_paths
    lock
    if [ ! -f "$STATE" ] && [ ! -e "$IMG" ]; then
        info "no instance at $DIR (nothing to do)"
        return 0
    fi
    teardown
    info "down: $DIR"
}

# ---------------------------------------------------------------- up

cmd_up() {
    need_root up
    local bytes; bytes=$(parse_size "$SIZE")
    [ "$bytes" -ge $((64 * MIB)) ] || die "--size $SIZE is too small (minimum 64M)"
    [ -e $CG/blkio.throttle.write_bps_device ] ||
        die "no cgroup-v1 blkio throttling ($CG/blkio.throttle.write_bps_device missing; needs CONFIG_BLK_DEV_THROTTLING and the v1 blkio hierarchy mounted at $CG)"
    command -v losetup >/dev/null || die "losetup not found (util-linux)"
    set_paths
    lock

    local fs=$FS
    if [ "$fs" = auto ]; then
        if command -v mkfs.xfs >/dev/null && [ "$bytes" -ge $((512 * MIB)) ]; then fs=xfs; else fs=ext4; fi
    fi
    command -v "mkfs.$fs" >/dev/null || die "mkfs.$fs not found (install xfsprogs or e2fsprogs)"
    [ "$fs" != xfs ] || [ "$bytes" -ge $((512 * MIB)) ] || die "--fs xfs needs --size >= 512M (XFS minimum), got $SIZE"

    # Already up? Then only (re)apply the limits; same settings => nothing is written.
    if load_state "$STATE"; then
        local src; src=$(mount_source "$DIR")
        if [ -n "$src" ] && [ "$src" = "${ST[loop]}" ] && loops_of "${ST[image]}" | grep -qxF -- "$src"; then
            [ "${ST[size_bytes]}" = "$bytes" ] ||
                die "$DIR is already up with --size ${ST[size_bytes]} bytes (asked $bytes): run 'slowpfs.sh down --dir $DIR' first"
            [ "$FS" = auto ] || [ "${ST[fs]}" = "$fs" ] ||
                die "$DIR is already up with --fs ${ST[fs]} (asked $fs): run 'slowpfs.sh down --dir $DIR' first"
            apply_limits "${ST[majmin]}" "$WMBPS" "$RMBPS" "$IOPS"
            bdi_apply "${ST[majmin]}" "$MAXDIRTY"
            if [ "${ST[write_mibs]}/${ST[read_mibs]}/${ST[iops]}/${ST[max_dirty_mib]}" != "$WMBPS/$RMBPS/$IOPS/$MAXDIRTY" ]; then
                ST[write_mibs]=$WMBPS ST[read_mibs]=$RMBPS ST[iops]=$IOPS ST[max_dirty_mib]=$MAXDIRTY
                save_state "$STATE"
                info "already up at $DIR; limits changed to write $WMBPS MiB/s, read $RMBPS MiB/s, iops $IOPS, max dirty $MAXDIRTY MiB"
            else
                info "already up at $DIR (${ST[loop]}, unchanged)"
            fi
            [ "$(stat -c %a "$DIR")" = 1777 ] || chmod 1777 "$DIR"
            return 0
        fi
        warn "found a half-built instance at $DIR: removing it and starting again"
        teardown
    elif [ -e "$IMG" ]; then
        warn "found a stale image $IMG (no state; e.g. after a reboot): removing it and starting again"
        teardown
    fi

    # Refuse to mount over something else.
    if mountpoint -q -- "$DIR" 2>/dev/null; then
        die "$DIR is already a mount point ($(mount_source "$DIR")); choose another --dir"
    fi

    # The image must be on a real disk: on tmpfs/ramfs the "slow PFS" would be RAM.
    mkdir -p -- "$IMAGE_DIR" || die "cannot create $IMAGE_DIR"
    local fstype; fstype=$(stat -f -c %T -- "$IMAGE_DIR")
    case $fstype in tmpfs | ramfs) die "$IMAGE_DIR is on $fstype (memory): set SLOWPFS_IMAGE_DIR to a disk-backed directory" ;; esac
    local avail; avail=$(df -B1 --output=avail -- "$IMAGE_DIR" | tail -1 | tr -d ' ')
    [ "$avail" -ge "$bytes" ] || warn "only $((avail / MIB)) MiB free under $IMAGE_DIR for a $((bytes / MIB)) MiB image (sparse: fine until it fills up)"

    # Topmost directory that mkdir -p creates for DIR (removed again by `down`).
    local top="" d=$DIR
    while [ ! -e "$d" ]; do top=$d; d=$(dirname -- "$d"); done
    [ -z "$top" ] || mkdir -p -- "$DIR" || die "cannot create $DIR"
    [ -d "$DIR" ] || die "$DIR exists and is not a directory"

    ST=([dir]=$DIR [image]=$IMG [size_bytes]=$bytes [fs]=$fs [write_mibs]=$WMBPS [read_mibs]=$RMBPS
        [iops]=$IOPS [max_dirty_mib]=$MAXDIRTY [created_top]=$top [loop]="" [majmin]="" [dio]=0)
    save_state "$STATE"      # from here on a failure leaves enough for `down` to clean up

    rm -f -- "$IMG"
    # Allocated up front (and mkfs told not to discard it again): a sparse image makes every
    # first write to a region of the PFS also allocate on the host's file system, which made
    # the PFS's rate depend on which of its blocks a run happened to reuse (drain vs fio on
    # the same PFS: 0.54-0.66 with a sparse image in one bench run, 0.85-0.96 right after on
    # blocks already written).
    if ! fallocate -l "$bytes" -- "$IMG" 2>/dev/null; then
        warn "fallocate of a $((bytes / MIB)) MiB image under $IMAGE_DIR failed; using a sparse image (first writes slower)"
        truncate -s "$bytes" -- "$IMG" || die "truncate -s $bytes $IMG failed"
    fi

    # Direct I/O on the loop device: the loop worker opens the image with O_DIRECT. Without it the
    # image is cached in RAM a second time and unthrottled O_DIRECT reads of the loop device came
    # from that cache at 4.8 GB/s (vs 1.3 GB/s from disk). The throttle itself sits at the loop
    # device's queue, above that cache, so it holds either way.
    local loop
    if loop=$(losetup --find --show --direct-io=on -- "$IMG" 2>/dev/null); then
        ST[dio]=1
    else
        warn "losetup --direct-io=on refused for $IMG; using a buffered loop device (image cached twice)"
        # losetup may have attached the image before failing to switch direct I/O on.
        loop=$(loops_of "$IMG" | head -n1)
        [ -n "$loop" ] || loop=$(losetup --find --show -- "$IMG") ||
            die "losetup --find --show $IMG failed (no free loop device?)"
    fi
    ST[loop]=$loop ST[majmin]=$(majmin_of "$loop")
    [ "$(cat "/sys/block/${loop#/dev/}/loop/dio" 2>/dev/null || echo 0)" = 1 ] || ST[dio]=0
    save_state "$STATE"

    # mkfs before the throttle is set, so it runs at full speed. ext4: no lazy init, otherwise
    # ext4lazyinit would write the inode tables in the background through the throttle.
    case $fs in
        xfs) mkfs.xfs -q -f -K -- "$loop" >/dev/null || die "mkfs.xfs $loop failed" ;;
        ext4) mkfs.ext4 -q -F -m 0 -E lazy_itable_init=0,lazy_journal_init=0,nodiscard -- "$loop" >/dev/null ||
            die "mkfs.ext4 $loop failed" ;;
    esac
    mount -t "$fs" -- "$loop" "$DIR" || die "mount -t $fs $loop $DIR failed"
    chmod 1777 -- "$DIR"

    apply_limits "${ST[majmin]}" "$WMBPS" "$RMBPS" "$IOPS"
    bdi_apply "${ST[majmin]}" "$MAXDIRTY"
    save_state "$STATE"

    info "up: $DIR on $loop (${ST[majmin]}, $fs, $((bytes / MIB)) MiB image $IMG, loop dio=${ST[dio]});" \
        "write $WMBPS MiB/s, read $RMBPS MiB/s, iops $IOPS, max dirty $MAXDIRTY MiB (0 = unlimited/kernel default)"
    local n; n=$(escaping_procs)
    [ "$n" -eq 0 ] || warn "$n process(es) sit in a non-root blkio cgroup: their O_DIRECT I/O and reads on $DIR are NOT throttled (use 'slowpfs.sh exec')"
}

# ---------------------------------------------------------------- status

cmd_status() {
    local files=() f
    if [ "$DIR_SET" = 1 ]; then
        set_paths; files=("$STATE")
    else
        for f in "$STATE_DIR"/*.conf; do [ -e "$f" ] && files+=("$f"); done
    fi
    local esc; esc=$(escaping_procs)
    local first=1 out="" mounted dev k alloc
    for f in "${files[@]}"; do
        if ! load_state "$f"; then
            [ "$JSON" = 1 ] || echo "no instance at $DIR"
            continue
        fi
        mounted=false
        [ -n "${ST[loop]}" ] && [ "$(mount_source "${ST[dir]}")" = "${ST[loop]}" ] && mounted=true
        dev=${ST[majmin]}
        declare -A K=([write_bps]=0 [read_bps]=0 [write_iops]=0 [read_iops]=0)
        if [ -n "$dev" ] && [ -e $CG/blkio.throttle.write_bps_device ]; then
            for k in write_bps read_bps write_iops read_iops; do K[$k]=$(blk_get "blkio.throttle.${k}_device" "$dev"); done
        fi
        alloc=0; [ -e "${ST[image]}" ] && alloc=$(($(stat -c '%b*%B' -- "${ST[image]}")))
        if [ "$JSON" = 1 ]; then
            [ "$first" = 1 ] || out+=","
            out+="{\"dir\":$(json_str "${ST[dir]}"),\"mounted\":$mounted,\"device\":$(json_str "${ST[loop]}")"
            out+=",\"majmin\":$(json_str "$dev"),\"fs\":$(json_str "${ST[fs]}"),\"image\":$(json_str "${ST[image]}")"
            out+=",\"size_bytes\":${ST[size_bytes]},\"image_allocated_bytes\":$alloc,\"loop_direct_io\":$([ "${ST[dio]}" = 1 ] && echo true || echo false)"
            out+=",\"write_mib_s\":${ST[write_mibs]},\"read_mib_s\":${ST[read_mibs]},\"iops\":${ST[iops]},\"max_dirty_mib\":${ST[max_dirty_mib]}"
            out+=",\"kernel\":{\"write_bps\":${K[write_bps]},\"read_bps\":${K[read_bps]},\"write_iops\":${K[write_iops]},\"read_iops\":${K[read_iops]}}"
            if [ -n "${ST[probe_write_mib_s]:-}" ]; then
                out+=",\"last_probe\":{\"write_mib_s\":${ST[probe_write_mib_s]},\"read_mib_s\":${ST[probe_read_mib_s]},\"at\":$(json_str "${ST[probe_at]}")}"
            fi
            out+="}"
        else
            echo "instance $(basename "$f" .conf)"
            echo "  dir:      ${ST[dir]} (mounted: $mounted)"
            echo "  device:   ${ST[loop]:--} (${dev:--}, ${ST[fs]}, loop direct I/O: $([ "${ST[dio]}" = 1 ] && echo on || echo off))"
            echo "  image:    ${ST[image]} ($((ST[size_bytes] / MIB)) MiB, $((alloc / MIB)) MiB allocated)"
            echo "  limits:   write ${ST[write_mibs]} MiB/s, read ${ST[read_mibs]} MiB/s, iops ${ST[iops]}, max dirty ${ST[max_dirty_mib]} MiB (0 = none)"
            echo "  kernel:   root blkio cgroup $dev: write_bps ${K[write_bps]} read_bps ${K[read_bps]} write_iops ${K[write_iops]} read_iops ${K[read_iops]}"
            if [ -n "${ST[probe_write_mib_s]:-}" ]; then
                echo "  measured: write ${ST[probe_write_mib_s]} MiB/s, read ${ST[probe_read_mib_s]} MiB/s (last probe, ${ST[probe_at]})"
            else
                echo "  measured: never (run 'slowpfs.sh probe')"
            fi
        fi
        first=0
    done
    if [ "$JSON" = 1 ]; then
        echo "{\"instances\":[${out}],\"unthrottled_processes\":$esc}"
    else
        [ "${#files[@]}" -gt 0 ] || echo "no instances"
        echo "processes in a non-root blkio cgroup (their O_DIRECT I/O and reads are not throttled): $esc"
    fi
}

# ---------------------------------------------------------------- probe

# dd ARGS... -> MiB/s, from dd's own byte count and elapsed time (which includes conv=fsync).
dd_rate() {
    local out
    out=$(dd "$@" 2>&1) || die "dd $* failed: $(printf '%s' "$out" | tail -1)"
    printf '%s\n' "$out" | awk '/ copied, / { for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1); b = $1 }
        END { if (s > 0) printf "%.1f\n", b / 1048576 / s; else print "0" }'
}

cmd_probe() {
    [ -d "$DIR" ] || die "no directory $DIR (run 'slowpfs.sh up' first, or pass --dir)"
    [ -w "$DIR" ] || die "$DIR is not writable for $(id -un)"
    local avail; avail=$(df -B1M --output=avail -- "$DIR" | tail -1 | tr -d ' ')
    [ "$avail" -gt $((PMIB + 16)) ] || die "only $avail MiB free in $DIR, probe needs $PMIB MiB (use --mib)"
    local line; line=$(grep -m1 -E '^[0-9]+:([^:]*,)?blkio(,[^:]*)?:' /proc/self/cgroup || true)
    [ -z "$line" ] || [ "${line##*:}" = / ] ||
        warn "this shell is in blkio cgroup '${line##*:}', not the root: the limits do not apply to it (use 'slowpfs.sh exec')"
    PROBE_FILE=$DIR/.slowpfs-probe.$$
    trap 'rm -f -- "$PROBE_FILE"' EXIT
    local f=$PROBE_FILE wf wd rd rb
    # 1. buffered write + fsync (what most applications and a cache drain do)
    wf=$(dd_rate if=/dev/zero of="$f" bs=1M count="$PMIB" conv=fsync)
    # 2. O_DIRECT overwrite of the same blocks
    wd=$(dd_rate if=/dev/zero of="$f" bs=1M count="$PMIB" oflag=direct conv=notrunc)
    # 3. O_DIRECT read (never from the page cache)
    rd=$(dd_rate if="$f" of=/dev/null bs=1M iflag=direct)
    # 4. buffered read after dropping this file's cached pages (posix_fadvise DONTNEED via
    #    dd iflag=nocache count=0; no global drop_caches)
    dd if="$f" iflag=nocache count=0 status=none || die "dd iflag=nocache count=0 on $f failed"
    rb=$(dd_rate if="$f" of=/dev/null bs=1M)
    rm -f -- "$f"
    if [ "$JSON" = 1 ]; then
        printf '{"write_mib_s":%s,"read_mib_s":%s,"write_direct_mib_s":%s,"read_buffered_mib_s":%s,"mib":%s,"dir":%s}\n' \
            "$wf" "$rd" "$wd" "$rb" "$PMIB" "$(json_str "$DIR")"
    else
        echo "probe of $DIR ($PMIB MiB, dd bs=1M):"
        echo "  write (buffered + fsync): $wf MiB/s"
        echo "  write (O_DIRECT):         $wd MiB/s"
        echo "  read  (O_DIRECT):         $rd MiB/s"
        echo "  read  (buffered, cold):   $rb MiB/s"
    fi
    # Remember the result in the instance's state (root only; status shows it).
    set_paths
    if [ "$(id -u)" -eq 0 ] && load_state "$STATE"; then
        ST[probe_write_mib_s]=$wf ST[probe_read_mib_s]=$rd ST[probe_at]=$(date -Is)
        save_state "$STATE"
    fi
}

# ---------------------------------------------------------------- exec

cmd_exec() {
    [ $# -gt 0 ] || die "exec needs a command"
    [ "${1:-}" != -- ] || shift
    [ $# -gt 0 ] || die "exec needs a command"
    need_root exec
    echo $$ >"$CG/cgroup.procs" 2>/dev/null || die "cannot move process $$ into the root blkio cgroup ($CG/cgroup.procs)"
    exec "$@"
}

# ---------------------------------------------------------------- main

CMD=${1:-}
[ $# -gt 0 ] && shift
case $CMD in
    up) parse_opts --dir --size --write-mbps --read-mbps --iops --max-dirty --fs --help -h -- "$@"; cmd_up ;;
    down) parse_opts --dir --help -h -- "$@"; cmd_down ;;
    status) parse_opts --dir --json --help -h -- "$@"; cmd_status ;;
    probe) parse_opts --dir --mib --json --help -h -- "$@"; cmd_probe ;;
    exec) case ${1:-} in -h | --help) usage; exit 0 ;; esac; cmd_exec "$@" ;;
    -h | --help | help) usage ;;
    '') usage >&2; exit 2 ;;
    *) die "unknown command '$CMD' (up, down, status, probe, exec; see --help)" ;;
esac
