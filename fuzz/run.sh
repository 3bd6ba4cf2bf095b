#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each, seeding the corpora from the real
# ledgers in ../shared/testdata. Needs cargo-fuzz (`cargo install cargo-fuzz`); the installed
# stable toolchain accepts cargo-fuzz's nightly flags with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=${*:-frames records header reassembler}
testdata=../../shared/testdata
mkdir -p corpus/records corpus/header
if [ -d "$testdata" ]; then
  # The record reader gets the start of a real framed stream; the header peek real ledgers' heads.
  head -c 65536 "$testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr" > corpus/records/testnet-head
  python3 - "$testdata" <<'PY'
import struct, sys
data = open(sys.argv[1] + "/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr", "rb").read()
off, n = 0, 0
while off < len(data) and n < 16:
    (mark,) = struct.unpack(">I", data[off:off + 4]); ln = mark & 0x7FFFFFFF
    open(f"corpus/header/testnet-{n}", "wb").write(data[off + 4:off + 4 + min(ln, 2048)])
    off += 4 + ln; n += 1
PY
fi
for t in $targets; do
  mkdir -p "corpus/$t"
  echo "== $t: ${secs}s"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 2>&1 \
    | grep -E "^(#[0-9]+.*DONE|Done|stat::|==[0-9]+== ERROR|SUMMARY|artifact_prefix|Test unit written)" || true
  if ls artifacts/"$t"/{crash,leak,timeout,oom}-* >/dev/null 2>&1; then
    echo "!! $t found a failing input:" artifacts/"$t"/*; exit 1
  fi
done
