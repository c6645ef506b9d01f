#!/usr/bin/env bash
# Installs the passthrough helper's systemd unit (part of `make install`) and, on a host where
# systemd runs and nothing is staged under DESTDIR, enables and starts it: without it a user's
# plain `surge run` moves every byte through its own process, at 0.15-0.26 of the fast tier's
# speed; with it, at the fast tier's speed (docs/DATAPLANE.md, docs/SECURITY.md "The
# passthrough helper").
#
# Usage: scripts/install-helper.sh PREFIX UNIT_DIR [DESTDIR] [ENABLE]
#   PREFIX    where `surge` is installed (its bin/surge goes into the unit's ExecStart)
#   UNIT_DIR  where systemd units go (/etc/systemd/system)
#   DESTDIR   staging root when packaging: the unit is written there, nothing is enabled
#   ENABLE    yes (default) or no: `make install HELPER=no` installs the unit only
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:?usage: $0 PREFIX UNIT_DIR [DESTDIR] [ENABLE]}
UNIT_DIR=${2:?usage: $0 PREFIX UNIT_DIR [DESTDIR] [ENABLE]}
DESTDIR=${3:-}
ENABLE=${4:-yes}
UNIT=surge-passthrough-helper.service
case $ENABLE in yes|no) ;; *) echo "install-helper.sh: HELPER must be yes or no, not '$ENABLE'" >&2; exit 2 ;; esac

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed "s|/usr/local/bin/surge|$PREFIX/bin/surge|" "contrib/systemd/$UNIT" >"$tmp"
install -D -m 0644 "$tmp" "$DESTDIR$UNIT_DIR/$UNIT"
echo "installed $DESTDIR$UNIT_DIR/$UNIT"

if [ -n "$DESTDIR" ]; then
    echo "staged under DESTDIR: the package's post-install should run 'systemctl enable --now $UNIT'"
elif [ "$ENABLE" = no ]; then
    echo "not enabled (HELPER=no): 'systemctl enable --now $UNIT' gives users' mounts passthrough"
elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable --now "$UNIT"
    echo "enabled and started $UNIT: users' mounts get kernel passthrough (socket /run/surge/passthrough.sock)"
else
    echo "systemd does not run here: start the helper at boot by other means, as root:"
    echo "  $PREFIX/bin/surge passthrough-helper --socket /run/surge/passthrough.sock"
    echo "(without it, a user's 'surge run' moves every byte through its own process)"
fi
