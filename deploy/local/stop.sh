#!/usr/bin/env bash
# Stops the nodes started by deploy/local/start.sh (SIGTERM: a clean stop).
set -uo pipefail
cd "$(dirname "$0")/../.."
for n in node1 node2 node3 namesrv1 namesrv2; do
  f="data/local/$n.pid"
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null && echo "stopped $n"
  rm -f "$f"
done
