# Sourced by the bench scripts: starts `raftmq dev` from "$bin" on base
# port "$base" in a fresh directory "$dir", stops it and removes the
# directory on exit, and waits (60 s at most) for its dev.json.
dir=$(mktemp -d)
"$bin" dev --dir "$dir" --base-port "$base" --node-config "$(dirname "${BASH_SOURCE[0]}")/bench-node.toml" >/dev/null 2>"$dir/dev.err" &
dev=$!
trap 'kill -INT $dev 2>/dev/null; wait $dev 2>/dev/null; [ -n "${KEEP_DIR:-}" ] && cp -r "$dir" "$KEEP_DIR"; rm -rf "$dir"' EXIT
for _ in $(seq 1 600); do [ -f "$dir/dev.json" ] && break; sleep 0.1; done
[ -f "$dir/dev.json" ] || { echo "raftmq dev did not start: $(tail -3 "$dir/dev.err")" >&2; exit 1; }
