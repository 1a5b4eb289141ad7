#!/usr/bin/env bash
# Starts two NameServers and the three-node loopback group of deploy/local/
# in the background (`raftmq dev` does the same in the foreground).
# Logs and pids go to data/local/. Stop it with deploy/local/stop.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${RAFTMQ_BIN:-target/release/raftmq}
[ -x "$bin" ] || cargo build --release
mkdir -p data/local
for i in 1 2; do
  "$bin" namesrv --config "deploy/local/namesrv$i.toml" >"data/local/namesrv$i.log" 2>&1 &
  echo $! >"data/local/namesrv$i.pid"
  echo "namesrv $i: pid $!, 127.0.0.1:987$((5 + i)), log data/local/namesrv$i.log"
done
for i in 1 2 3; do
  "$bin" broker --config "deploy/local/node$i.toml" >"data/local/node$i.log" 2>&1 &
  echo $! >"data/local/node$i.pid"
  echo "node $i: pid $!, client 127.0.0.1:808$i, metrics http://127.0.0.1:910$i/metrics, log data/local/node$i.log"
done
