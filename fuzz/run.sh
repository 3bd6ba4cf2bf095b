#!/usr/bin/env bash
# Runs fuzz targets for SECONDS (default 60) each, seeding the corpora from the real ledgers in
# testdata/: `fuzz/run.sh [SECONDS] [TARGET ...]` (default: every target in
# fuzz/fuzz_targets). Needs cargo-fuzz (`cargo install cargo-fuzz`); the installed stable
# toolchain accepts cargo-fuzz's nightly flags with RUSTC_BOOTSTRAP=1.
#
# The pass is honest: it exits non-zero, with a one-line reason, when cargo-fuzz is missing, a
# target does not exist or does not build, a run finds a failing input, or a run ends without
# libFuzzer's final statistics (it died at start-up, or executed nothing). For each target it
# prints one line: executions, executions per second, coverage (edges) and features reached.
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true

fail() {
  echo "fuzz: error: $*" >&2
  exit 1
}

case "$secs" in
  '' | *[!0-9]*) fail "SECONDS must be a whole number of seconds, not '$secs'" ;;
esac
[ "$secs" -ge 1 ] || fail "SECONDS must be at least 1"

all=$(cd fuzz_targets && ls -- *.rs 2>/dev/null | sed 's/\.rs$//' | sort)
targets=${*:-$all}
for t in $targets; do
  [ -f "fuzz_targets/$t.rs" ] || fail "no fuzz target '$t' (targets: $(echo $all))"
done
command -v cargo-fuzz >/dev/null 2>&1 || fail "cargo-fuzz is not installed (cargo install cargo-fuzz)"

testdata=../testdata
mkdir -p corpus/records corpus/header corpus/content corpus/lake_batch corpus/lake_names corpus/stored
# The ring's decoder gets one whole stored ledger (the harness seals it and stamps its part ids;
# see wire::fuzzing::stored): a record of two raw chunks of 10 and 20 bytes, then their parts.
python3 - <<'PY' || fail "seeding the stored corpus failed"
import struct
record = struct.pack(">IIQQ", 1, 2, 30, 0) + bytes([1]) * 32 + bytes(32) + struct.pack(">QQ", 0, 0)
record += struct.pack(">IQ", 2, 0)
def part(index, offset, n):
    return bytes(8) + b"\0" + struct.pack(">IBQII", index, 0, offset, n, n) + b"\xab" * n
data = b"\x03" + b"".join(struct.pack(">H", len(v)) + v for v in (record, part(0, 0, 10), part(1, 10, 20)))
open("corpus/stored/two-chunks", "wb").write(data)
PY
if [ -d "$testdata" ]; then
  # The lake decoder gets Galexie's own objects and batches of real ledgers; the name and
  # manifest parser real names and a manifest.
  cp "$testdata"/standalone/galexie-testbucket/*.xdr.zstd corpus/lake_batch/
  printf 'FFEA7BFF--1410048.xdr.zst' > corpus/lake_names/batch
  printf 'FFEA7BFF--1410048-1410079' > corpus/lake_names/partition
  printf '{"networkPassphrase":"Test SDF Network ; September 2015","version":"1.0","compression":"zstd","ledgersPerBatch":1,"batchesPerPartition":64000}' > corpus/lake_names/manifest
  # The record reader gets the start of a real framed stream; the header peek real ledgers'
  # heads; the content check whole real ledgers.
  head -c 65536 "$testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr" > corpus/records/testnet-head
  python3 - "$testdata" <<'PY' || fail "seeding the header corpus from $testdata failed"
import struct, sys
data = open(sys.argv[1] + "/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr", "rb").read()
off, n = 0, 0
while off < len(data) and n < 16:
    (mark,) = struct.unpack(">I", data[off:off + 4]); ln = mark & 0x7FFFFFFF
    open(f"corpus/header/testnet-{n}", "wb").write(data[off + 4:off + 4 + min(ln, 2048)])
    open(f"corpus/content/testnet-{n}", "wb").write(data[off + 4:off + 4 + ln])
    off += 4 + ln; n += 1
# LedgerCloseMetaBatch XDR of one and of two consecutive ledgers.
off, bodies = 0, []
while off < len(data) and len(bodies) < 3:
    (mark,) = struct.unpack(">I", data[off:off + 4]); ln = mark & 0x7FFFFFFF
    bodies.append(data[off + 4:off + 4 + ln]); off += 4 + ln
seq = 1410048
for k in (1, 2):
    batch = struct.pack(">III", seq, seq + k - 1, k) + b"".join(bodies[:k])
    open(f"corpus/lake_batch/testnet-{k}", "wb").write(batch)
PY
fi

export RUSTC_BOOTSTRAP=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for t in $targets; do
  mkdir -p "corpus/$t"
  # Build first, so a target that no longer compiles is named as such, not as a failed run.
  if ! cargo fuzz build "$t" >"$logs/$t.build" 2>&1; then
    tail -n 20 "$logs/$t.build" >&2
    fail "$t: the fuzz target does not build (cargo fuzz build $t)"
  fi
  echo "== $t: ${secs}s"
  cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 \
    >"$logs/$t.log" 2>&1
  status=$?
  if ls artifacts/"$t"/{crash,leak,timeout,oom,slow-unit}-* >/dev/null 2>&1 || [ "$status" -ne 0 ]; then
    grep -E "^(==[0-9]+== ERROR|SUMMARY|artifact_prefix|Test unit written)" "$logs/$t.log" >&2
    ls artifacts/"$t"/ 2>/dev/null | sed "s|^|  artifacts/$t/|" >&2
    fail "$t: the run failed (exit $status); see the input and the report above"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$logs/$t.log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$logs/$t.log" | tail -n 1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logs/$t.log" | tail -n 1)
  if [ -z "$execs" ] || [ -z "$done_line" ]; then
    tail -n 20 "$logs/$t.log" >&2
    fail "$t: the run ended without libFuzzer's final statistics (it did not reach its time limit)"
  fi
  [ "$execs" -gt 0 ] || fail "$t: the run executed no input"
  cov=$(echo "$done_line" | sed -n 's/.*cov: *\([0-9]*\).*/\1/p')
  ft=$(echo "$done_line" | sed -n 's/.*ft: *\([0-9]*\).*/\1/p')
  corp=$(echo "$done_line" | sed -n 's/.*corp: *\([0-9]*\).*/\1/p')
  echo "   $t: ${execs} executions, ${rate} exec/s, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?}"
done
