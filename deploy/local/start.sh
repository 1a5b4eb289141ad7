#!/usr/bin/env bash
# Starts the NameServer and the three-node loopback group of deploy/local/
# in the background.
# Logs and pids go to data/local/. Stop it with deploy/local/stop.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${RAFTMQ_BIN:-target/release/raftmq}
[ -x "$bin" ] || cargo build --release
mkdir -p data/local
"$bin" namesrv --config deploy/local/namesrv.toml >data/local/namesrv.log 2>&1 &
echo $! >data/local/namesrv.pid
echo "namesrv: pid $!, 127.0.0.1:9876, log data/local/namesrv.log"
for i in 1 2 3; do
  "$bin" broker --config "deploy/local/node$i.toml" >"data/local/node$i.log" 2>&1 &
  echo $! >"data/local/node$i.pid"
  echo "node $i: pid $!, client 127.0.0.1:808$i, log data/local/node$i.log"
done
