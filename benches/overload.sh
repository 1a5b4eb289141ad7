#!/usr/bin/env bash
# Ten times the load a group sustains, then back to normal: what a greedy
# crowd of producers and consumers does to `raftmq dev` (three nodes, each
# its own process, default config).
#
#   [CLIENT_BIN=...] [RECEIVERS=160] bash benches/overload.sh [RAFTMQ_BIN] [BASE_PORT]
#
# 1. sustainable: 64 closed-loop senders (each waits for its answer) for
#    10 s through all three endpoints: S msgs/s and its latency;
# 2. overload: eight producer processes (each its own connections) offer
#    10 x S sends/s in all, open loop, up to 1024 outstanding each, for
#    30 s, with RECEIVERS (default 160) receivers of a second group;
# 3. recovery: the sustainable load again, as soon as the crowd stops,
#    for 10 s, with its rate second by second;
# 4. audit: a new consumer group drains the topic; the id of every
#    acknowledged send must be among what it received.
# Prints each phase's report (admitted, refused with TOO_MANY_REQUESTS,
# other errors, latency of the admitted), the nodes' peak memory, whether
# every node stayed up, how many seconds the rate took to come back to
# 90 % of the sustainable one, and the audit. Exits 1 if a node died or an
# acknowledged message is missing.
#
# Defaults: target/release/raftmq, base port 32000. CLIENT_BIN (default:
# the same binary) runs the load, so that two builds of the broker can be
# compared under the same generator.
set -euo pipefail
bin=${1:-target/release/raftmq}
base=${2:-32000}
client=${CLIENT_BIN:-$bin}
. "$(dirname "$0")/dev_cluster.sh"
endpoints="127.0.0.1:$((base + 8081));127.0.0.1:$((base + 8082));127.0.0.1:$((base + 8083))"
pids=$(python3 -c "import json,sys;print(' '.join(str(n['pid']) for n in json.load(open(sys.argv[1]))['nodes']))" "$dir/dev.json")
field() { python3 -c "import json,sys;print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
show() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
print(f"{sys.argv[1]:<12} {r['ok']:>8} ok {r['msgs_per_s']:>8.0f}/s  refused {r['refused']:>7}  errors {r['errors']:>5}  "
      f"p50 {r['p50_ms']:>7.2f}  p99 {r['p99_ms']:>8.2f}  max {r['max_ms']:>8.2f} ms")
PY
}
rss_peak=0
sample_rss() {
  for p in $pids; do
    kb=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    [ "$kb" -gt "$rss_peak" ] && rss_peak=$kb
  done
  return 0
}

sleep 2
base_run=$("$client" bench produce --endpoint "$endpoints" --concurrency 64 --duration 10s --json --ids "$dir/acked.base")
show sustainable "$base_run"
rate=$(python3 -c "import json,sys;print(int(10 * json.loads(sys.argv[1])['msgs_per_s']))" "$base_run")
clients=8
receivers=${RECEIVERS:-160}
echo "overload: $clients producer processes offering $rate sends/s in all for 30 s, with $receivers receivers"
if [ "$receivers" -gt 0 ]; then
  "$client" bench consume --endpoint "$endpoints" --group Crowd --concurrency "$receivers" --duration 30s --json >"$dir/consume.json" &
else
  sleep 30 &
  echo '{"ok": 0, "errors": 0}' >"$dir/consume.json"
fi
consumers=$!
producers=()
for i in $(seq 1 "$clients"); do
  "$client" bench produce --endpoint "$endpoints" --rate "$((rate / clients))" --concurrency 1024 --duration 30s \
    --json --ids "$dir/acked.over.$i" >"$dir/overload.$i.json" &
  producers+=($!)
done
while kill -0 "${producers[0]}" 2>/dev/null; do sample_rss; sleep 1; done
wait "${producers[@]}"
wait "$consumers"
# The clients' reports as one: counts summed, latency the worst client's.
over=$(python3 - "$dir"/overload.*.json <<'PY'
import json, sys
rs = [json.load(open(f)) for f in sys.argv[1:]]
out = {k: sum(r[k] for r in rs) for k in ("ok", "refused", "errors", "not_offered", "msgs_per_s")}
out.update({k: max(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "max_ms")})
out["first_error"] = next((r["first_error"] for r in rs if r.get("first_error")), None)
print(json.dumps(out))
PY
)
# The load has dropped: how soon is the group back to normal?
after=$("$client" bench produce --endpoint "$endpoints" --concurrency 64 --duration 10s --json --plot "$dir/recovery.png" \
  --ids "$dir/acked.after")
show overload "$over"
echo "             not offered (a client's 1024 outstanding all busy): $(field "$over" not_offered); latency: the worst client's"
echo "             first error: $(field "$over" first_error)"
show recovery "$after"
python3 - "$(cat "$dir/consume.json")" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"receivers    {r['ok']:>8} received, {r['errors']:>5} errors, p99 send-to-receive not measured (consume)")
PY
alive=0
for p in $pids; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
echo "nodes alive: $alive of 3; peak RSS of a node: $((rss_peak / 1024)) MiB"
python3 - "$base_run" "$after" <<'PY'
import json, sys
base, after = (json.loads(a) for a in sys.argv[1:])
rates = after["per_second"][: int(after["secs"])]
back = next((i + 1 for i, r in enumerate(rates) if r >= 0.9 * base["msgs_per_s"]), None)
print(f"recovery: {after['msgs_per_s'] / base['msgs_per_s']:.2f} of the sustainable rate over 10 s; "
      f"second by second: {' '.join(str(r) for r in rates)}; "
      + (f"at 90 % of it within {back} s" if back else "never at 90 % of it"))
PY
cat "$dir"/acked.* >"$dir/acked"
acked=$(wc -l <"$dir/acked")
# Sends of unknown outcome may be stored too: drain until they are in, or
# 10 s pass with nothing new.
errors=$(python3 -c "import json,sys;print(sum(json.loads(a)['errors'] for a in sys.argv[1:]))" "$base_run" "$over" "$after")
"$client" bench consume --endpoint "$endpoints" --group Audit --concurrency 16 --count "$((acked + errors))" --json \
  --ids "$dir/audited" >"$dir/audit.json"
missing=$(python3 - "$dir/acked" "$dir/audited" <<'PY'
import sys
acked = set(open(sys.argv[1]).read().split())
got = open(sys.argv[2]).read().split()
missing = acked - set(got)
extra = len(got) - len(set(got))
print(len(missing))
print(f"audit: {len(acked)} acknowledged ids, {len(set(got))} received by a new group "
      f"({extra} received twice), {len(missing)} missing", file=sys.stderr)
for m in sorted(missing)[:5]:
    print(f"  missing: {m}", file=sys.stderr)
PY
)
[ "$missing" -eq 0 ] && [ "$alive" -eq 3 ]
