#!/usr/bin/env bash
# Pending timed messages at scale, on a real `raftmq dev` cluster (three
# brokers and a NameServer on 127.0.0.1): send N timed messages due in 10
# days, then restart the cluster and compare with the same cluster before
# them (the baseline, measured in the same run):
#   - send rate of timed messages vs plain ones;
#   - each broker's memory after a restart: anonymous (heap: the timer
#     index) and file-backed (mapped CommitLog pages touched);
#   - restart time (until `raftmq dev` reports the group ready) and the
#     snapshot's size.
# Timed messages are indexed, not loaded: the heap grows by tens of bytes
# per pending message, not by its body, and a restart does not read bodies.
#
#   cargo build --release && N=1000000 bash benches/held_scale.sh
set -euo pipefail

N=${N:-1000000}
BODY=${BODY:-256}
BIN=${BIN:-target/release/raftmq}
P=${BASE_PORT:-21000}
DIR=$(mktemp -d /tmp/held-scale.XXXXXX)
NAMESRV=127.0.0.1:$((9876 + P))
EP="127.0.0.1:$((8081 + P));127.0.0.1:$((8082 + P));127.0.0.1:$((8083 + P))"
DEV=

# Arithmetic and HTTP through Python (no bc or curl needed).
calc() { python3 -c "print(round($1, 2))"; }

stop_dev() {
  if [ -n "$DEV" ]; then
    kill -INT "$DEV" 2>/dev/null || true
    wait "$DEV" 2>/dev/null || true
    DEV=
  fi
}
trap 'stop_dev; rm -rf "$DIR"' EXIT

# Starts the cluster; sets STARTED to the seconds until it was ready.
start_dev() {
  local t0
  t0=$(date +%s.%N)
  "$BIN" dev --dir "$DIR" --base-port "$P" --node-config "$(dirname "$0")/bench-node.toml" >>"$DIR/dev.out" 2>&1 &
  DEV=$!
  for _ in $(seq 1 1200); do
    [ -f "$DIR/dev.json" ] && break
    sleep 0.05
  done
  [ -f "$DIR/dev.json" ] || { echo "the cluster did not start:" >&2; tail -n 5 "$DIR"/*.log >&2; exit 1; }
  STARTED=$(calc "$(date +%s.%N) - $t0")
}

# Sum over the brokers of a /proc/PID/status field, in MiB.
mem() {
  local total=0 pid kb
  for pid in $(python3 -c "import json;print(' '.join(str(n['pid']) for n in json.load(open('$DIR/dev.json'))['nodes']))"); do
    kb=$(awk -v f="$1:" '$1 == f { print $2 }' "/proc/$pid/status")
    total=$((total + kb))
  done
  calc "$total / 1024"
}

snapshot_mib() {
  calc "$(stat -c %s "$DIR/node1/raft/snapshot.json") / 1048576"
}

rate() { python3 -c "import json,sys;print(round(json.load(sys.stdin)['msgs_per_s']))"; }

pending() {
  local m
  m=$(python3 -c "import json;print(json.load(open('$DIR/dev.json'))['nodes'][0]['metrics_addr'])")
  python3 -c "import urllib.request;print(urllib.request.urlopen('http://$m/metrics').read().decode())" |
    awk '/^raftmq_timers_pending/ { print $2 }'
}

echo "held_scale: N=$N timed messages of $BODY bytes, cluster in $DIR"
start_dev
for _ in $(seq 1 100); do
  "$BIN" topic create --namesrv "$NAMESRV" --topic Timed --queues 8 --message-type DELAY >/dev/null 2>&1 && break
  sleep 0.3
done
stop_dev
start_dev
base_start=$STARTED
base_anon=$(mem RssAnon)
base_file=$(mem RssFile)

plain=$("$BIN" bench produce --endpoint "$EP" --topic TestTopic --count "$N" --concurrency 64 --size "$BODY" --json | rate)
timed=$("$BIN" bench produce --endpoint "$EP" --topic Timed --delay 240h --count "$N" --concurrency 64 --size "$BODY" --json | rate)
sleep 1
held=$(pending)
loaded_anon=$(mem RssAnon)
stop_dev
start_dev
held_start=$STARTED
held_anon=$(mem RssAnon)
held_file=$(mem RssFile)
after=$(pending)
snap=$(snapshot_mib)
stop_dev

body_mib=$(calc "$N * $BODY / 1048576")
printf '%-44s %12s %12s %8s\n' "" baseline "$N pending" ratio
printf '%-44s %12s %12s %8.2f\n' "send rate, msgs/s (plain vs timed)" "$plain" "$timed" "$(calc "$timed / $plain")"
printf '%-44s %12.2f %12.2f %8.2f\n' "restart until ready, s" "$base_start" "$held_start" "$(calc "$held_start / $base_start")"
printf '%-44s %12s %12s %8.2f\n' "heap (RssAnon) after restart, MiB, 3 nodes" "$base_anon" "$held_anon" "$(calc "$held_anon / $base_anon")"
printf '%-44s %12s %12s\n' "mapped files (RssFile) after restart, MiB" "$base_file" "$held_file"
printf '%-44s %12s\n' "heap before the restart, MiB, 3 nodes" "$loaded_anon"
printf '%-44s %12s\n' "timers pending (before / after restart)" "$held / $after"
printf '%-44s %12s\n' "snapshot.json, MiB (one node)" "$snap"
printf '%-44s %12s\n' "bodies held, MiB (one node's share)" "$body_mib"
printf '%-44s %12s\n' "heap growth per pending message, bytes/node" \
  "$(calc "($held_anon - $base_anon) * 1048576 / 3 / $N")"
