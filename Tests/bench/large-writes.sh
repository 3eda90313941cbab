#!/bin/bash
# Large writes against a 3-node local cluster (docs/benchmarks.md, "Large writes"):
# CLIENTS clients each PUT a generated object of about 15 MiB one after another for SECONDS
# seconds, spread over the nodes; prints writes, failures, elections (term and leader-change
# deltas) and each node's longest tick gap (banyan_raft_tick_gap_max_ms).
# usage: [QUOTA=bytes] Tests/bench/large-writes.sh [BANYAN_BINARY] [SECONDS] [CLIENTS] [PORT_BASE]
set -u
BIN=${1:-.build/release/banyan}; SECS=${2:-25}; CLIENTS=${3:-4}; BASE=${4:-29500}
DIR=$(mktemp -d /tmp/banyan-large.XXXXXX)
trap 'pkill -f "$DIR/cl" 2>/dev/null; rm -rf "$DIR"' EXIT
python3 -c "
import json
obj = {f'k{i:06d}': {'v': i, 's': 'x'*80} for i in range(137000)}
open('$DIR/body.json','w').write(json.dumps(obj))"
"$BIN" cluster local --nodes 3 --dir "$DIR/cl" --client-port "$BASE" --peer-port $((BASE + 100)) > "$DIR/cluster.log" 2>&1 &
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$BASE/warm.json?auth=owner" -d 1)" = 200 ] && break
  sleep 0.3
done
if [ -n "${QUOTA:-}" ]; then
  # A quota on the namespace written (QUOTA bytes, large enough to accept every write): each
  # write is then measured where it applies (docs/operations.md, "Namespace quotas").
  echo "quota: $(curl -s -X PUT "http://127.0.0.1:$BASE/.settings/quota.json?ns=default&auth=owner" -d "$QUOTA")"
fi
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
terms_before="$(metric $BASE banyan_raft_term)"
end=$(( $(date +%s) + SECS ))
for c in $(seq 1 "$CLIENTS"); do
  ( port=$((BASE + (c % 3))); ok=0; bad=0
    while [ "$(date +%s)" -lt "$end" ]; do
      code=$(curl -s -o /dev/null -w '%{http_code}' -m 120 -X PUT "http://127.0.0.1:$port/big/c$c.json?auth=owner" --data-binary @"$DIR/body.json")
      if [ "$code" = 200 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
    done
    echo "client $c: $ok written, $bad failed" ) &
done
wait $(jobs -p | tail -n "$CLIENTS")
sleep 1
echo "body: $(wc -c < "$DIR/body.json") bytes; term before $terms_before, after $(metric $BASE banyan_raft_term)"
for i in 0 1 2; do
  echo "node $((i + 1)): leader changes $(metric $((BASE + i)) banyan_raft_leader_changes_total), longest tick gap $(metric $((BASE + i)) banyan_raft_tick_gap_max_ms) ms"
done
