#!/bin/bash
# Replacing a large subtree on one node (docs/benchmarks.md, "Namespace quota cost"): PUT
# /users of 340,000 records (a 15.99 MB body), then three times PUT it again (replacing it
# whole) and DELETE it, printing each DELETE's latency and the node's tick-gap and slow-pass
# metrics. Before 72a8fef the replaced subtree was freed on the loop that ticks Raft.
# With QUOTA=bytes, a quota on the namespace first: the replaced subtree is then also measured
# (off the loop since the deferred measure), and the usage is printed at the end.
# usage: [QUOTA=bytes] Tests/bench/replace-large.sh [BANYAN_BINARY] [PORT]
set -u
BIN=${1:-.build/release/banyan}; PORT=${2:-32120}
DIR=$(mktemp -d /tmp/banyan-replace.XXXXXX)
"$BIN" serve --data-dir "$DIR/data" --listen "127.0.0.1:$PORT" --peer-listen "127.0.0.1:$((PORT + 1))" --log-level warning > "$DIR/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/.json?auth=owner" && break; sleep 0.2; done
python3 -c "
import json
print(json.dumps({'u%d' % i: {'name': 'user %d' % i, 'score': i} for i in range(340000)}, separators=(',', ':')))" > "$DIR/users.json"
echo "body bytes $(stat -c %s "$DIR/users.json")"
URL="http://127.0.0.1:$PORT/users.json?auth=owner"
if [ -n "${QUOTA:-}" ]; then
  echo "quota: $(curl -s -X PUT "http://127.0.0.1:$PORT/.settings/quota.json?ns=default&auth=owner" -d "$QUOTA")"
fi
curl -s -o /dev/null -w "PUT %{http_code} %{time_total}s\n" -X PUT --data-binary @"$DIR/users.json" "$URL"
for _ in 1 2 3; do
  curl -s -o /dev/null -X PUT --data-binary @"$DIR/users.json" "$URL"
  sleep 2
  curl -s -o /dev/null -w "DELETE %{http_code} %{time_total}s\n" -X DELETE "$URL"
  sleep 1
done
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^banyan_raft_tick_gap_max_ms|^banyan_raft_slow_passes_total"
[ -n "${QUOTA:-}" ] && echo "usage after: $(curl -s "http://127.0.0.1:$PORT/.settings/quota.json?ns=default&auth=owner")"
curl -s -o /dev/null -X PUT --data-binary @"$DIR/users.json" "$URL"
[ -n "${QUOTA:-}" ] && sleep 2 && echo "usage with /users: $(curl -s "http://127.0.0.1:$PORT/.settings/quota.json?ns=default&auth=owner")"
exit 0
