#!/usr/bin/env bash
# Stops the nodes started by deploy/local/start.sh (SIGTERM: a clean stop).
set -uo pipefail
cd "$(dirname "$0")/../.."
for i in 1 2 3; do
  f="data/local/node$i.pid"
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null && echo "stopped node $i"
  rm -f "$f"
done
