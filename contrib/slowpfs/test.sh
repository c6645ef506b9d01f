#!/bin/bash
# Self-check of slowpfs.sh (exit 0 = pass; "SKIPPED: reason" + exit 0 when not root or no loop
# devices). Builds a small instance (1G image, write 100 MiB/s, read 200 MiB/s), checks that
# `up` is idempotent, that the measured rates are within [0.5, 1.3] x the limits, for root and
# for a non-root user, that `exec` throttles a process from a child blkio cgroup, then that
# `down` leaves nothing (mount, loop device, blkio rules, bdi settings, cgroup, image, state).
# Takes about 20 s.
set -euo pipefail
export LC_ALL=C
HERE=$(cd "$(dirname "$0")" && pwd)
SP=$HERE/slowpfs.sh
D=/run/surge-slowpfs-test/pfs            # not the default DIR: an admin's instance is left alone
W=100 R=200                              # MiB/s
TUSER=surge-slowpfs-test
ESC_CG=/sys/fs/cgroup/blkio/surge-slowpfs-test-escape
START=$SECONDS

if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: not root"; exit 0; fi
if [ ! -e /dev/loop-control ] && [ ! -e /dev/loop0 ]; then echo "SKIPPED: no loop device support"; exit 0; fi
if ! command -v losetup >/dev/null; then echo "SKIPPED: no losetup (util-linux)"; exit 0; fi

FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok:   $*"; }
# Value of "key":number or "key":"string" in a one-line JSON text.
jget() { grep -o "\"$1\":[^,}]*" <<<"$2" | head -n1 | cut -d: -f2- | tr -d '"'; }
# in_range NAME VALUE LIMIT: VALUE within [0.5, 1.3] x LIMIT
in_range() {
    if awk -v v="$2" -v l="$3" 'BEGIN { exit !(v >= 0.5 * l && v <= 1.3 * l) }'; then
        ok "$1 = $2 MiB/s (limit $3)"
    else
        fail "$1 = $2 MiB/s, outside [0.5, 1.3] x $3"
    fi
}
# dd ARGS -> MiB/s (dd's own figures)
rate() {
    awk '/ copied, / { for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1); b = $1 }
         END { if (s > 0) printf "%.1f\n", b / 1048576 / s; else print 0 }' <<<"$("$@" 2>&1)"
}

CREATED_USER=0
cleanup() {
    if [ -d "$ESC_CG" ]; then rmdir "$ESC_CG" 2>/dev/null || true; fi
    "$SP" down --dir "$D" >/dev/null 2>&1 || true
    if [ "$CREATED_USER" = 1 ]; then userdel "$TUSER" 2>/dev/null || true; fi
}
trap cleanup EXIT

"$SP" down --dir "$D" >/dev/null 2>&1 || true      # clean slate (down is idempotent)

# ---- up
"$SP" up --dir "$D" --size 1G --write-mbps $W --read-mbps $R || { fail "slowpfs.sh up"; exit 1; }
ST1=$("$SP" status --dir "$D" --json)
LOOP=$(jget device "$ST1") DEV=$(jget majmin "$ST1") IMG=$(jget image "$ST1")
echo "instance: $LOOP ($DEV), image $IMG"
if [ "$(jget mounted "$ST1")" = true ] && mountpoint -q "$D" && [ "$(findmnt -n -o SOURCE --mountpoint "$D")" = "$LOOP" ]; then
    ok "mounted $LOOP at $D"
else fail "not mounted: $ST1"; fi
if [ "$(stat -c %a "$D")" = 1777 ]; then ok "mode 1777"; else fail "mode of $D is $(stat -c %a "$D")"; fi
IMGFS=$(stat -f -c %T "$(dirname "$IMG")")
if [ -f "$IMG" ] && [ "$IMGFS" != tmpfs ] && [ "$IMGFS" != ramfs ]; then ok "image on $IMGFS (disk)"; else fail "image $IMG missing or on $IMGFS"; fi
if [ "$(cat "/sys/block/${LOOP#/dev/}/loop/dio")" = 1 ]; then ok "loop direct I/O on"; else fail "loop direct I/O off"; fi
if [ "$(awk -v d="$DEV" '$1 == d { print $2 }' /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device)" = $((W * 1048576)) ]; then
    ok "write_bps rule in the root blkio cgroup"
else fail "no write_bps rule for $DEV"; fi

# ---- idempotent up: same settings, nothing changes
"$SP" up --dir "$D" --size 1G --write-mbps $W --read-mbps $R 2>/dev/null || fail "second up failed"
ST2=$("$SP" status --dir "$D" --json)
if [ "$ST1" = "$ST2" ]; then ok "second up changed nothing"; else fail "second up changed the state: $ST1 -> $ST2"; fi
if "$SP" up --dir "$D" --size 2G --write-mbps $W --read-mbps $R 2>/dev/null; then fail "up with another --size succeeded"
else ok "up with another --size is refused"; fi
if ERR=$("$SP" up --dir "$D" --write-mbps abc 2>&1); then fail "up --write-mbps abc succeeded"
elif grep -q -- "--write-mbps.*'abc'" <<<"$ERR"; then ok "bad value is named in the error: $ERR"
else fail "error for --write-mbps abc does not name the option: $ERR"; fi

# ---- probe as root
P=$("$SP" probe --dir "$D" --mib 256 --json) || fail "probe failed"
echo "probe (root): $P"
in_range "root write (buffered+fsync)" "$(jget write_mib_s "$P")" $W
in_range "root write (O_DIRECT)" "$(jget write_direct_mib_s "$P")" $W
in_range "root read (O_DIRECT)" "$(jget read_mib_s "$P")" $R
in_range "root read (buffered, cold)" "$(jget read_buffered_mib_s "$P")" $R

# ---- non-root user
if ! id "$TUSER" >/dev/null 2>&1; then useradd -M -s /usr/sbin/nologin "$TUSER"; CREATED_USER=1; fi
if runuser -u "$TUSER" -- sh -c "echo hello > '$D/user-file'" && [ "$(stat -c %U "$D/user-file")" = "$TUSER" ]; then
    ok "$TUSER can create a file in $D"
else fail "$TUSER cannot write to $D"; fi
PU=$(runuser -u "$TUSER" -- "$SP" probe --dir "$D" --mib 128 --json) || fail "probe as $TUSER failed"
echo "probe ($TUSER): $PU"
in_range "$TUSER write (buffered+fsync)" "$(jget write_mib_s "$PU")" $W
in_range "$TUSER write (O_DIRECT)" "$(jget write_direct_mib_s "$PU")" $W
in_range "$TUSER read (O_DIRECT)" "$(jget read_mib_s "$PU")" $R
rm -f "$D/user-file"

# ---- a process in a child blkio cgroup escapes the limit (cgroup-v1 blkio is flat);
#      `slowpfs.sh exec` brings it back under the limit
mkdir -p "$ESC_CG"
in_child() { bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$ESC_CG" "$@"; }
ESC=$(rate in_child dd if=/dev/zero of="$D/esc" bs=1M count=128 oflag=direct)
echo "info: O_DIRECT write from a child blkio cgroup, without exec: $ESC MiB/s (expected: unthrottled; documented limitation)"
EX=$(rate in_child "$SP" exec dd if=/dev/zero of="$D/esc" bs=1M count=128 oflag=direct)
in_range "child-cgroup write through 'slowpfs.sh exec'" "$EX" $W
# Buffered writes from the child cgroup are held back by the dirty cap (64 MiB) behind the
# throttled writeback. Part of the first 64 MiB can go at memory speed and the final fsync runs
# unthrottled in the child, so the upper bound is looser here (measured: 102-106 MiB/s at 100).
BF=$(rate in_child dd if=/dev/zero of="$D/esc" bs=1M count=256 conv=fsync)
if awk -v v="$BF" -v l=$W 'BEGIN { exit !(v <= 1.5 * l) }'; then ok "child-cgroup buffered+fsync write = $BF MiB/s (<= 1.5 x $W: held by the dirty cap)"
else fail "child-cgroup buffered+fsync write = $BF MiB/s, not throttled (> 1.5 x $W)"; fi
rm -f "$D/esc"
rmdir "$ESC_CG"

# ---- down, and nothing is left
"$SP" down --dir "$D" || fail "down failed"
if mountpoint -q "$D" 2>/dev/null; then fail "$D still mounted"; else ok "unmounted"; fi
if [ -e "$IMG" ]; then fail "$IMG still there"; else ok "image removed"; fi
if [ -z "$(losetup -n -O NAME -j "$IMG" 2>/dev/null)" ] && [ "$(cat "/sys/block/${LOOP#/dev/}/loop/backing_file" 2>/dev/null)" != "$IMG" ]; then
    ok "loop device detached"
else fail "a loop device still holds $IMG"; fi
for f in write_bps read_bps write_iops read_iops; do
    awk -v d="$DEV" '$1 == d { found = 1 } END { exit found }' "/sys/fs/cgroup/blkio/blkio.throttle.${f}_device" ||
        fail "blkio rule for $DEV left in blkio.throttle.${f}_device"
done
ok "no blkio rules left for $DEV"
B=/sys/class/bdi/$DEV
if [ ! -d "$B" ] || { [ "$(cat "$B/max_ratio")" = 100 ] && [ "$(cat "$B/strict_limit")" = 0 ]; }; then ok "bdi $DEV reset"
else fail "bdi $DEV not reset (max_ratio $(cat "$B/max_ratio"), strict_limit $(cat "$B/strict_limit"))"; fi
if ls -d /sys/fs/cgroup/blkio/surge-slowpfs* >/dev/null 2>&1; then fail "cgroup dir left: $(ls -d /sys/fs/cgroup/blkio/surge-slowpfs*)"
else ok "no cgroup dir left"; fi
if [ -e /run/surge-slowpfs-test ]; then fail "/run/surge-slowpfs-test left"; else ok "mount point removed"; fi
if [ -e "/run/surge-slowpfs/instances/$(basename "$IMG" .img).conf" ]; then fail "state file left"; else ok "state removed"; fi
if "$SP" down --dir "$D" >/dev/null 2>&1; then ok "second down succeeds"; else fail "second down failed"; fi

T=$((SECONDS - START))
if [ "$T" -lt 60 ]; then ok "took ${T}s"; else fail "took ${T}s (limit 60 s)"; fi
if [ "$FAILS" -gt 0 ]; then echo "slowpfs test: $FAILS failure(s)"; exit 1; fi
echo "slowpfs test: PASS"
