#!/usr/bin/env bash
# Writes what a package installs besides the binaries, generated from the binaries' own
# command-line definitions so it never drifts from them:
#
#   OUT/man/man1/*.1                  man pages of ledger-relay (and its subcommands),
#                                     ledger-subscribe and ledger-certs (and theirs)
#   OUT/completions/bash/NAME         bash completions  (/usr/share/bash-completion/completions/)
#   OUT/completions/zsh/_NAME         zsh completions   (/usr/share/zsh/vendor-completions/)
#   OUT/completions/fish/NAME.fish    fish completions  (/usr/share/fish/vendor_completions.d/)
#
# Usage: packaging/assets.sh BIN_DIR OUT   (BIN_DIR holds the built binaries, for example
# target/release after `cargo build --release --bins`)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BIN_DIR OUT" >&2
  exit 2
fi
bin=$1
out=$2
mkdir -p "$out/man/man1" "$out/completions/bash" "$out/completions/zsh" "$out/completions/fish"
"$bin/ledger-relay" man "$out/man/man1" >/dev/null
"$bin/ledger-certs" man "$out/man/man1" >/dev/null
"$bin/ledger-subscribe" --man "$out/man/man1" >/dev/null
for tool in ledger-relay ledger-certs; do
  "$bin/$tool" completions bash >"$out/completions/bash/$tool"
  "$bin/$tool" completions zsh >"$out/completions/zsh/_$tool"
  "$bin/$tool" completions fish >"$out/completions/fish/$tool.fish"
done
"$bin/ledger-subscribe" --completions bash >"$out/completions/bash/ledger-subscribe"
"$bin/ledger-subscribe" --completions zsh >"$out/completions/zsh/_ledger-subscribe"
"$bin/ledger-subscribe" --completions fish >"$out/completions/fish/ledger-subscribe.fish"
echo "wrote $(find "$out" -type f | wc -l) files under $out"
