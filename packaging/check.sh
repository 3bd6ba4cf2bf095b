#!/usr/bin/env bash
# CI's packaging checks (run by .ci/run after the tests, with the debug binaries built):
# the example relay config passes `check-config`, the man pages and completions generate, and
# the systemd units pass `systemd-analyze verify` (with their ExecStart binaries and the man
# pages of their Documentation= present) where that command exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

packaging/assets.sh "$bin" "$work/assets"

# The example config, with its certificate directory made here and its paths moved into $work.
"$bin/ledger-certs" init "$work/certs" >/dev/null
"$bin/ledger-certs" issue-server "$work/certs" --name relay --san 127.0.0.1 >/dev/null
sed -e "s|/etc/ledger-relay/certs|$work/certs|" -e "s|/var/lib/ledger-relay|$work/data|" \
  packaging/config/relay.toml >"$work/relay.toml"
"$bin/ledger-relay" check-config --config "$work/relay.toml"

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "skipped: systemd-analyze verify (no systemd-analyze on this machine)"
  exit 0
fi
mkdir "$work/units"
for unit in packaging/systemd/*.service; do
  sed "s|/usr/bin/|$PWD/$bin/|g" "$unit" >"$work/units/$(basename "$unit")"
done
if ! command -v man >/dev/null 2>&1; then
  echo "note: no man command: Documentation= entries are not checked"
  systemd-analyze verify --man=no "$work"/units/*.service
else
  MANPATH="$work/assets/man" systemd-analyze verify "$work"/units/*.service
fi
echo "systemd-analyze verify: ok ($(ls "$work/units" | tr '\n' ' '))"
