#!/usr/bin/env bash
# Relay CPU per ledger with N subscribers on loopback (separate processes).
set -euo pipefail
B=$(cd "$(dirname "$0")/.." && pwd)/target/release
n=$1; ratio=${2:-7.6}; codec=${3:-zstd}; count=25
d=$(mktemp -d)
$B/ledger-certs init $d/c >/dev/null
$B/ledger-certs issue-server $d/c --name relay --san 127.0.0.1 >/dev/null
$B/ledger-certs issue-client $d/c --name rpc-1 >/dev/null
port=$((7400 + RANDOM % 500))
RUST_LOG=warn $B/ledger-relay run --listen 127.0.0.1:$port --certs $d/c --data-dir $d/data \
  --source "synthetic:count=$count,ratio=$ratio" --codec $codec --cadence 600ms 2>$d/relay.log &
rp=$!
sleep 0.5
pids=()
for i in $(seq 1 $n); do
  $B/ledger-subscribe --relay 127.0.0.1:$port --certs $d/c --name rpc-1 --from 2 --count $count --out /dev/null --stats $d/s$i.csv 2>/dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
read -r ut st < <(awk '{print $14, $15}' /proc/$rp/stat)
hz=$(getconf CLK_TCK)
kill -INT $rp; wait $rp || true
python3 - "$d" "$n" "$count" "$ut" "$st" "$hz" <<'PY'
import sys, csv, glob
d, n, count, ut, st, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
cpu_ms = (ut + st) * 1000 / hz
lat = []
for f in glob.glob(d + "/s*.csv"):
    rows = list(csv.DictReader(open(f)))
    lat += [float(r["delivery_ms"]) for r in rows[2:]]
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"subscribers={n} relay_cpu={cpu_ms:.0f} ms total, {cpu_ms/count:.1f} ms/ledger; delivery p50 {q(.5):.2f} p99 {q(.99):.2f} max {lat[-1]:.2f} ms over {len(lat)} deliveries")
PY
rm -rf $d
