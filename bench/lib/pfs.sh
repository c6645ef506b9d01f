# The slow PFS a bench script runs against, shared by the cache benches. Source it, then
#   pfs_up KIND SUBDIR   KIND slow: contrib/slowpfs (a throttled disk; WMBPS/RMBPS MiB/s);
#                        KIND net: contrib/netpfs (GlusterFS over a veth link of RATE with a
#                        network's latency; an instance already up is used as it is and left
#                        up). Sets PFS (SUBDIR under the PFS mount, made) and PFS_TEXT.
#   pfs_down             takes down what pfs_up brought up (for the script's EXIT trap).
#   pfs_cold             drops what the PFS client caches of PFS's files, so reads go to it.
PFS_STARTED=
pfs_up() {
    local kind=$1 sub=$2
    case $kind in
        slow)
            contrib/slowpfs/slowpfs.sh up --dir /run/surge-slowpfs/pfs --size 8G \
                --write-mbps "$WMBPS" --read-mbps "$RMBPS" >/dev/null
            PFS_STARTED=slow
            PFS=/run/surge-slowpfs/pfs/$sub
            PFS_TEXT="/run/surge-slowpfs/pfs throttled to $WMBPS MiB/s write, $RMBPS MiB/s read" ;;
        net)
            if ! mountpoint -q /run/surge-netpfs/pfs 2>/dev/null; then
                contrib/netpfs/netpfs.sh up --rate "$RATE" >/dev/null
                PFS_STARTED=net
            fi
            PFS=/run/surge-netpfs/pfs/$sub
            PFS_TEXT="$(contrib/netpfs/netpfs.sh status)" ;;
        *) echo "$(basename "$0"): --pfs is slow or net, not '$kind'" >&2; exit 2 ;;
    esac
    mkdir -p "$PFS"
}
pfs_down() {
    case $PFS_STARTED in
        slow) contrib/slowpfs/slowpfs.sh down --dir /run/surge-slowpfs/pfs >/dev/null 2>&1 || true ;;
        net) contrib/netpfs/netpfs.sh down >/dev/null 2>&1 || true ;;
        *) [ -n "${PFS:-}" ] && rm -rf "$PFS" ;;
    esac
}
pfs_cold() { # FILE...
    case ${PFS:-} in
        /run/surge-netpfs/*) contrib/netpfs/netpfs.sh cold >/dev/null ;;
        *) for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none; done ;;
    esac
}
