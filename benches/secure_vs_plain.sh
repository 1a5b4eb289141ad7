#!/usr/bin/env bash
# What TLS and ACL cost a sender: two `raftmq dev` clusters side by side,
# one plain and one `--secure` (TLS on every port, every call signed and
# checked against the Super user's ACL), under the same load (1 KiB bodies,
# one message per SendMessage, through all three nodes' endpoints), runs
# alternating between them so that noise falls on both alike.
#
#   bash benches/secure_vs_plain.sh       # RUNS=3 DURATION=10 by default
#
# Rows at concurrency 64 and 1, each the median (min-max) of RUNS runs;
# the ratio line is secure / plain for msgs/s and plain / secure for p50
# and p99 (1.00: TLS and ACL cost nothing).
#
# Builds the release raftmq. Ports: plain base 2000 (clients 10081..),
# secure base 4000 (clients 12081..).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
duration=${DURATION:-10}
cargo build --quiet --release --bin raftmq
bin=target/release/raftmq

results=$(mktemp)
dirs=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$results" "${dirs[@]}"
}
trap cleanup EXIT

# Starts dev with base port $1 and extra flags; sets `dir`.
start_dev() {
  local base=$1
  shift
  dir=$(mktemp -d)
  dirs+=("$dir")
  "$bin" dev --dir "$dir" --base-port "$base" --node-config benches/bench-node.toml "$@" >/dev/null 2>"$dir/dev.err" &
  pids+=($!)
  for _ in $(seq 1 600); do [ -f "$dir/dev.json" ] && break; sleep 0.1; done
  [ -f "$dir/dev.json" ] || { echo "raftmq dev did not start: $(tail -3 "$dir/dev.err")" >&2; exit 1; }
}
field() { python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1/dev.json" "$2"; }

start_dev 2000
plain_endpoints="127.0.0.1:10081;127.0.0.1:10082;127.0.0.1:10083"
start_dev 4000 --secure
secure_endpoints="127.0.0.1:12081;127.0.0.1:12082;127.0.0.1:12083"
secure_flags=(--ca-cert "$(field "$dir" ca_cert)" --access-key "$(field "$dir" admin_access_key)"
  --secret-key "$(field "$dir" admin_secret_key)")
sleep 2

for _ in $(seq 1 "$runs"); do
  for c in 64 1; do
    r=$("$bin" bench produce --endpoint "$plain_endpoints" --concurrency "$c" --duration "${duration}s" --size 1024 --json)
    echo "plain c=$c $r" >>"$results"
    r=$("$bin" bench produce --endpoint "$secure_endpoints" --concurrency "$c" --duration "${duration}s" --size 1024 \
      --json "${secure_flags[@]}")
    echo "secure c=$c $r" >>"$results"
  done
done

PYTHONPATH=benches python3 - "$results" <<'PY'
import sys
from bench_table import header, line, load, median

rows = load(sys.argv[1])
print(header(6))
for row in ["c=64", "c=1"]:
    for system in ["plain", "secure"]:
        print(line(row, system, rows[row][system], 6))
    p, s = rows[row]["plain"], rows[row]["secure"]
    print(f"{'':<6} {'ratio':<7} msgs/s x{median(s, 'msgs_per_s') / median(p, 'msgs_per_s'):.2f}   "
          f"p50 x{median(p, 'p50_ms') / max(median(s, 'p50_ms'), 1e-9):.2f}   "
          f"p99 x{median(p, 'p99_ms') / max(median(s, 'p99_ms'), 1e-9):.2f}  (secure vs plain; 1.00: no cost)")
PY
