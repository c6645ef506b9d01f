#!/usr/bin/env bash
# Builds the Debian package `surge` (what `make deb` runs): the binary, libdatawarp and its
# header, the interposition library (/usr/lib/surge/libsurge_preload.so, for
# `SURGE_CLIENT=preload`), the systemd units, the example configuration (as /etc/surge/surge.toml, a conffile),
# the Slurm files and the docs, with a post-install that creates the service user `surge` and
# its directories and says how to make the keys (packaging/deb/postinst).
#
# Usage: packaging/deb/build.sh [--surge BIN] [--libdatawarp SO] [--preload SO] [--out DIR] [--fast]
#   --surge        the surge executable (default target/release/surge)
#   --libdatawarp  libdatawarp.so (default: beside the executable)
#   --preload      libsurge_preload.so (default: beside the executable)
#   --out          where the .deb goes (default target/debian); its path is printed last
#   --fast         gzip -1 instead of xz and no stripping (tests)
# Needs dpkg-deb, dpkg-shlibdeps (dpkg-dev) and objcopy (binutils); no network, no cargo-deb.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SURGE=$ROOT/target/release/surge
LIBDW=
PRELOAD=
OUT=$ROOT/target/debian
FAST=no
while [ $# -gt 0 ]; do
    case $1 in
        --surge) SURGE=$2; shift 2 ;;
        --libdatawarp) LIBDW=$2; shift 2 ;;
        --preload) PRELOAD=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --fast) FAST=yes; shift ;;
        *) echo "build.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
    esac
done
LIBDW=${LIBDW:-$(dirname "$SURGE")/libdatawarp.so}
PRELOAD=${PRELOAD:-$(dirname "$SURGE")/libsurge_preload.so}
for f in "$SURGE" "$LIBDW" "$PRELOAD"; do
    [ -f "$f" ] || { echo "build.sh: $f does not exist (make release builds all three)" >&2; exit 1; }
done
for t in dpkg-deb dpkg-shlibdeps objcopy; do
    command -v $t >/dev/null || { echo "build.sh: needs $t (apt install dpkg-dev binutils)" >&2; exit 1; }
done

VERSION=$("$SURGE" --version | awk '{print $2}')
[ -n "$VERSION" ] || { echo "build.sh: '$SURGE --version' printed no version" >&2; exit 1; }
ARCH=$(dpkg --print-architecture)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
P=$WORK/pkg
install -d "$P/DEBIAN" "$P/usr/bin" "$P/usr/lib" "$P/usr/lib/surge" "$P/usr/include" "$P/lib/systemd/system" \
    "$P/etc/surge" "$P/usr/share/doc/surge" "$P/usr/share/surge/slurm"

# Binaries: release builds keep line tables (Cargo profile); the package ships them stripped.
if [ $FAST = yes ]; then
    install -m 0755 "$SURGE" "$P/usr/bin/surge"
    install -m 0644 "$LIBDW" "$P/usr/lib/libdatawarp.so"
    install -m 0644 "$PRELOAD" "$P/usr/lib/surge/libsurge_preload.so"
else
    objcopy --strip-debug "$SURGE" "$P/usr/bin/surge" && chmod 0755 "$P/usr/bin/surge"
    objcopy --strip-debug "$LIBDW" "$P/usr/lib/libdatawarp.so" && chmod 0644 "$P/usr/lib/libdatawarp.so"
    objcopy --strip-debug "$PRELOAD" "$P/usr/lib/surge/libsurge_preload.so" \
        && chmod 0644 "$P/usr/lib/surge/libsurge_preload.so"
fi
install -m 0644 "$ROOT/crates/surge-datawarp/include/datawarp.h" "$P/usr/include/datawarp.h"
# mount(8)'s helper for `-t fuse.surge` and fstab (the binary answers to that name).
install -d "$P/usr/sbin"
ln -sf ../bin/surge "$P/usr/sbin/mount.fuse.surge"

# Units: the package's surge is /usr/bin/surge.
for u in "$ROOT"/contrib/systemd/*.service; do
    sed 's|/usr/local/bin/surge|/usr/bin/surge|g' "$u" > "$P/lib/systemd/system/$(basename "$u")"
    chmod 0644 "$P/lib/systemd/system/$(basename "$u")"
done

# Configuration: the example as the live file (a conffile: upgrades keep the admin's edits)
# and as the pristine copy the docs point at.
install -m 0644 "$ROOT/contrib/surge.toml" "$P/etc/surge/surge.toml"
install -m 0644 "$ROOT/contrib/surge.toml" "$P/usr/share/doc/surge/surge.toml"
install -m 0644 "$ROOT/docs/INSTALL.md" "$P/usr/share/doc/surge/INSTALL.md"
install -m 0644 "$ROOT/docs/SECURITY.md" "$P/usr/share/doc/surge/SECURITY.md"
install -m 0644 "$ROOT/docs/DIRECTIVES.md" "$P/usr/share/doc/surge/DIRECTIVES.md"
# The Slurm files, with the package's surge in them (the manager's address, slurm.conf's path
# and the default pool are the site's to fill in).
for f in README.md burst_buffer.lua burst_buffer.conf job_submit.lua; do
    sed 's|@SURGE@|/usr/bin/surge|g' "$ROOT/contrib/slurm/$f" > "$P/usr/share/surge/slurm/$f"
    chmod 0644 "$P/usr/share/surge/slurm/$f"
done
cat > "$P/usr/share/doc/surge/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: surge
Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
EOF

# Depends: the shared libraries the binaries link (dpkg-shlibdeps, as debhelper does), and
# the programs Surge runs: fusermount3 (fuse3) and munged (munge).
mkdir -p "$WORK/src/debian"
printf 'Source: surge\n\nPackage: surge\nArchitecture: any\n' > "$WORK/src/debian/control"
SHLIBS=$(cd "$WORK/src" && dpkg-shlibdeps -O "$P/usr/bin/surge" "$P/usr/lib/libdatawarp.so" 2>/dev/null \
    | sed -n 's/^shlibs:Depends=//p')
[ -n "$SHLIBS" ] || { echo "build.sh: dpkg-shlibdeps found no libraries" >&2; exit 1; }
SIZE=$(du -sk --exclude=DEBIAN "$P" | cut -f1)
cat > "$P/DEBIAN/control" <<EOF
Package: surge
Version: $VERSION
Architecture: $ARCH
Maintainer: Surge developers <surge@localhost>
Installed-Size: $SIZE
Depends: $SHLIBS, fuse3, munge, adduser | passwd
Recommends: systemd
Section: admin
Priority: optional
Description: open burst buffer for HPC clusters (DataWarp-compatible)
 Surge turns fast devices (NVMe, SSD, RAM) on burst-buffer nodes into on-demand
 file systems for jobs, stages data between them and the parallel file system,
 and runs DataWarp job scripts (#DW jobdw, stage_in, stage_out) under Slurm's
 burst_buffer/lua or surge run. One binary: manager, server, agent, mover,
 passthrough helper, benchmarks, profiler, advisor, tuner and simulator;
 libdatawarp for codes that call DataWarp's C API.
EOF
echo /etc/surge/surge.toml > "$P/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    install -m 0755 "$ROOT/packaging/deb/$s" "$P/DEBIAN/$s"
done

mkdir -p "$OUT"
DEB=$OUT/surge_${VERSION}_${ARCH}.deb
if [ $FAST = yes ]; then
    dpkg-deb --root-owner-group -Zgzip -z1 --build "$P" "$DEB" >/dev/null
else
    dpkg-deb --root-owner-group --build "$P" "$DEB" >/dev/null
fi
echo "$DEB"
