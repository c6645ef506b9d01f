#!/bin/bash
# Self-check of netpfs.sh (exit 0 = pass; "SKIPPED: reason" + exit 0 when not root, without
# network namespaces or /dev/fuse, or when an instance is already up: an admin's is left alone).
# Brings the GlusterFS PFS up with 2 ms added per direction and a 200 Mbit/s link, checks that
# a create costs at least the round trip and that re-shaping in place to no delay makes it
# cheaper, that the rate holds (dd with fsync within [0.5, 1.3] x the link), that a file written
# by a non-root user reads back byte for byte after `cold` (a fresh client), that `up` twice
# refuses nothing, then that `down` leaves nothing (mount, namespaces, gluster processes,
# nfdelay, state, brick). Installs the packages on first use (apt); then about 20 s.
set -euo pipefail
export LC_ALL=C
HERE=$(cd "$(dirname "$0")" && pwd)
NP=$HERE/netpfs.sh
D=/run/surge-netpfs-test/pfs

if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: not root"; exit 0; fi
if [ ! -e /dev/fuse ]; then echo "SKIPPED: no /dev/fuse"; exit 0; fi
if ! ip netns add surge_netpfs_probe 2>/dev/null; then echo "SKIPPED: no network namespaces"; exit 0; fi
ip netns del surge_netpfs_probe
if [ -f /run/surge-netpfs/conf ]; then
    echo "SKIPPED: netpfs is up ($("$NP" status)); 'netpfs.sh down' first to run this check"
    exit 0
fi

FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok:   $*"; }
trap '"$NP" down >/dev/null 2>&1 || true' EXIT

# Median milliseconds of a create + close + unlink in DIR (Python: no process start per op).
create_ms() {
    python3 - "$1" <<'EOF'
import os, sys, time
d = sys.argv[1]
ts = []
for i in range(40):
    p = os.path.join(d, f"c{i}")
    t = time.perf_counter()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.close(fd)
    ts.append(time.perf_counter() - t)
    os.unlink(p)
ts.sort()
print(f"{ts[len(ts) // 2] * 1000:.2f}")
EOF
}

"$NP" up --dir "$D" --rate 200mbit --delay-us 2000 || { fail "netpfs.sh up"; exit 1; }
if mountpoint -q "$D" && [ "$(findmnt -n -o FSTYPE --mountpoint "$D")" = fuse.glusterfs ]; then
    ok "GlusterFS mounted at $D"
else fail "$D is not a GlusterFS mount"; fi
[ "$(stat -c %a "$D")" = 1777 ] && ok "mode 1777" || fail "mode of $D is $(stat -c %a "$D")"
ST=$("$NP" status --json)
grep -q '"delay_us_per_direction":2000' <<<"$ST" && ok "status: $ST" || fail "status: $ST"

slow=$(create_ms "$D")
if awk -v s="$slow" 'BEGIN { exit !(s >= 4.0) }'; then
    ok "create at +2 ms per direction: $slow ms (>= one 4 ms round trip)"
else fail "create at +2 ms per direction took $slow ms, less than one round trip (4 ms)"; fi

mib=$(dd if=/dev/zero of="$D/big" bs=1M count=48 conv=fsync 2>&1 |
    awk '/ copied, / { for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1); b = $1 }
         END { printf "%.1f", b / 1048576 / s }')
# 200 Mbit/s = 23.8 MiB/s of payload at most
if awk -v v="$mib" 'BEGIN { exit !(v >= 0.5 * 23.8 && v <= 1.3 * 23.8) }'; then
    ok "write with fsync over the 200 Mbit/s link: $mib MiB/s"
else fail "write with fsync: $mib MiB/s, outside [0.5, 1.3] x 23.8"; fi
rm -f "$D/big"

"$NP" up --dir "$D" --rate 10gbit --delay-us 0 || fail "re-shaping in place"
fast=$(create_ms "$D")
if awk -v s="$slow" -v f="$fast" 'BEGIN { exit !(f + 2.0 <= s) }'; then
    ok "create with no added delay: $fast ms (was $slow)"
else fail "re-shaped to no delay, a create still took $fast ms (was $slow)"; fi

head -c 8388608 /dev/urandom > /tmp/netpfs-test.$$
chown nobody /tmp/netpfs-test.$$
if runuser -u nobody -- cp /tmp/netpfs-test.$$ "$D/user-file"; then
    "$NP" cold
    if cmp -s /tmp/netpfs-test.$$ "$D/user-file" && [ "$(stat -c %U "$D/user-file")" = nobody ]; then
        ok "a non-root user's file reads back byte for byte from a fresh client"
    else fail "the file written by nobody differs after 'cold' (or lost its owner)"; fi
else fail "user nobody cannot write in $D"; fi
rm -f /tmp/netpfs-test.$$

"$NP" down
left=()
mountpoint -q "$D" 2>/dev/null && left+=("mount $D")
ip netns list | grep -q surge_pfs_ && left+=("namespaces: $(ip netns list | grep surge_pfs_ | tr '\n' ' ')")
live() { ps -eo pid=,stat=,comm= | awk -v n="$1" '$2 !~ /^Z/ && $3 == n { print $1 }'; }
[ -n "$(live glusterd)" ] && left+=("glusterd")
pgrep -f 'glusterfsd.*surgepfs' >/dev/null && left+=("glusterfsd")
pgrep -f 'glusterfs.*surgepfs' >/dev/null && left+=("glusterfs client")
[ -n "$(live nfdelay)" ] && left+=("nfdelay")
[ -e /run/surge-netpfs ] && left+=("/run/surge-netpfs")
[ -e /var/tmp/surge-netpfs/brick ] && left+=("the brick")
if [ ${#left[@]} -eq 0 ]; then ok "down leaves nothing"; else fail "down left: ${left[*]}"; fi

if [ $FAILS -gt 0 ]; then echo "netpfs test: $FAILS failure(s)"; exit 1; fi
echo "netpfs test: all passed"
