#!/usr/bin/env bash
# What a dead follower costs its leader: starts `raftmq dev`, kills one
# follower with SIGKILL, and measures the leader for 10 s: how much its log
# grows and how much CPU it uses (from /proc). NOKILL=1 measures the same
# cluster with nothing killed, the idle baseline.
#
#   bash benches/peer_down.sh [RAFTMQ_BIN] [BASE_PORT]
#
# Defaults: target/release/raftmq, base port 31000 (clients 39081..).
set -euo pipefail
bin=${1:-target/release/raftmq}
base=${2:-31000}
. "$(dirname "$0")/dev_cluster.sh"
pid_of() { python3 -c "import json,sys;print([n['pid'] for n in json.load(open(sys.argv[1]))['nodes'] if n['node_id']==int(sys.argv[2])][0])" "$dir/dev.json" "$1"; }
leader=; follower=
for n in 1 2 3; do
  role=$("$bin" node status --endpoint "127.0.0.1:$((8080 + n + base))" | awk 'NR==1 {print $6}')
  if [ "$role" = leader ]; then leader=$n; elif [ -z "$follower" ]; then follower=$n; fi
done
[ -n "$leader" ] || { echo "no leader found" >&2; exit 1; }
leader_pid=$(pid_of "$leader")
if [ -z "${NOKILL:-}" ]; then kill -9 "$(pid_of "$follower")"; fi
sleep 1
log="$dir/node$leader.log"
cpu() { awk '{print $14 + $15}' "/proc/$leader_pid/stat"; }
s0=$(stat -c %s "$log"); c0=$(cpu)
sleep 10
s1=$(stat -c %s "$log"); c1=$(cpu)
what=$([ -n "${NOKILL:-}" ] && echo "nothing killed" || echo "follower $follower killed")
secs=$(awk -v a="$c0" -v b="$c1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }')
echo "leader node $leader, $what: log grew $((s1 - s0)) bytes in 10 s; CPU $secs s"
