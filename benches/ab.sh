#!/usr/bin/env bash
# Two raftmq builds side by side, in the same run, under the same load: the
# way a change to the data path is measured (a baseline built from the
# commit before it, against the build with it).
#
#   bash benches/ab.sh BASE_BIN NEW_BIN      # RUNS=3 DURATION=10 by default
#
# e.g. git worktree add /tmp/base HEAD~1 &&
#      (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release --bin raftmq) &&
#      cargo build --release --bin raftmq &&
#      bash benches/ab.sh /tmp/base-target/release/raftmq target/release/raftmq
#
# Rows, each the min/median/max of RUNS runs of DURATION seconds, 1 KiB
# bodies, against all three access points of a fresh `raftmq dev` cluster:
#   c=16 batch100   16 senders, 100 messages per SendMessage
#   c=64 single     64 senders, one message per request
# The runs alternate between the builds (base, new, base, new...) so that
# a noisy neighbour hurts both alike. Beside msgs/s and latency, each row
# gives the CPU the three broker processes spent per acknowledged message
# (user + system, from /proc/<pid>/stat), which noise on a shared machine
# moves far less than throughput, and the largest heap (RssAnon) of the
# three after the row. The last lines are new / base.
# The load generator is NEW_BIN's `bench produce` for both, so only the
# brokers differ. Ports: base 35000.
#
# BASE_SETUP / NEW_SETUP: raftmq arguments each cluster of that side is
# given once it runs (with --namesrv appended), to compare settings of one
# build, e.g. what the deduplication window costs:
#   NEW_SETUP="cluster dedup --broker dev --window-ms 0" \
#     bash benches/ab.sh target/release/raftmq target/release/raftmq
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 BASE_BIN NEW_BIN" >&2; exit 2; }
base_bin=$1
new_bin=$2
runs=${RUNS:-3}
duration=${DURATION:-10}
results=$(mktemp)
port=35000
endpoints="127.0.0.1:$((port + 8081));127.0.0.1:$((port + 8082));127.0.0.1:$((port + 8083))"

dev=
dir=
stop_dev() {
  if [ -n "$dev" ]; then
    kill -INT "$dev" 2>/dev/null || true
    wait "$dev" 2>/dev/null || true
    dev=
  fi
  [ -n "$dir" ] && rm -rf "$dir"
  dir=
}
trap 'stop_dev; rm -f "$results"' EXIT

row() {
  local system=$1 name=$2
  shift 2
  local before report
  before=$(python3 benches/bench_table.py ticks $pids)
  report=$("$new_bin" bench produce --endpoint "$endpoints" --duration "${duration}s" --size 1024 --json "$@")
  # The brokers' CPU per message and their largest heap (bench_table.py).
  python3 benches/bench_table.py record "$system" "$name" "$report" "$before" $pids >>"$results"
}

for r in $(seq 1 "$runs"); do
  for system in base new; do
    bin=$base_bin
    [ "$system" = new ] && bin=$new_bin
    dir=$(mktemp -d)
    "$bin" dev --dir "$dir" --base-port "$port" --node-config benches/bench-node.toml >/dev/null 2>"$dir/dev.err" &
    dev=$!
    for _ in $(seq 1 600); do [ -f "$dir/dev.json" ] && break; sleep 0.1; done
    [ -f "$dir/dev.json" ] || { echo "raftmq dev did not start: $(tail -3 "$dir/dev.err")" >&2; exit 1; }
    pids=$(python3 -c "import json,sys;print(' '.join(str(n['pid']) for n in json.load(open(sys.argv[1]))['nodes']))" "$dir/dev.json")
    sleep 2
    setup=${BASE_SETUP:-}
    [ "$system" = new ] && setup=${NEW_SETUP:-}
    if [ -n "$setup" ]; then
      namesrv=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['namesrv_addr'])" "$dir/dev.json")
      # shellcheck disable=SC2086 # the arguments are words on purpose
      "$bin" $setup --namesrv "$namesrv" >/dev/null
    fi
    echo "run $r/$runs: $system" >&2
    row "$system" "c=16-batch100" --concurrency 16 --batch 100
    row "$system" "c=64-single" --concurrency 64
    stop_dev
  done
done

PYTHONPATH=benches python3 - "$results" <<'PY'
import statistics, sys
from bench_table import cell, first_errors, header, line, load, median

rows = load(sys.argv[1])
width = max(len(r) for r in rows)
print(header(width) + "   broker CPU us/msg   heap MiB")
for row, systems in rows.items():
    for system in ["base", "new"]:
        if system in systems:
            reports = systems[system]
            print(line(row, system, reports, width) + "   " + cell([r["cpu_us_per_msg"] for r in reports], "{:.1f}")
                  + "   " + cell([r["heap_mib"] for r in reports], "{:.0f}"))
for row, systems in rows.items():
    b, n = systems.get("base"), systems.get("new")
    if b and n:
        print(f"{row}: new/base msgs/s x{median(n, 'msgs_per_s') / max(median(b, 'msgs_per_s'), 1e-9):.2f}, "
              f"p99 x{median(n, 'p99_ms') / max(median(b, 'p99_ms'), 1e-9):.2f}, "
              f"CPU/msg x{median(n, 'cpu_us_per_msg') / max(median(b, 'cpu_us_per_msg'), 1e-9):.2f}")
for e in first_errors(rows):
    print(e)
PY
