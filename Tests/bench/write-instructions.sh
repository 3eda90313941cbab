#!/bin/bash
# Instructions per write (docs/benchmarks.md, "Instructions per write"): a 3-node cluster with
# every node under callgrind, 8 keep-alive clients writing small values to the leader
# (`PUT /bench/c<t>/k<n>.json?print=silent`); counting starts after a warm-up and stops after
# WRITES writes per client. Prints the user-space instructions per write of the leader, of each
# follower and of all three. Instruction counts do not depend on how busy the machine is, so two
# builds can be compared on a shared machine where `banyan bench`'s CPU time cannot (it moves
# by 2x between days here). Kernel work (syscalls, TCP, fsync) is not counted.
# Needs valgrind, curl and python3; takes 1-3 minutes.
# usage: Tests/bench/write-instructions.sh [BANYAN_BINARY] [WRITES_PER_CLIENT] [PORT_BASE]
# AS_CLIENTS=1: each client writes {"c":<t>,"i":<n>} as user c<t> (an emulator-style unsigned
# token) instead of a number as the owner; RULES=file also sets those rules on namespace bench
# first (docs/examples/bench-rules.json judges exactly these writes), so the two runs give the
# cost of judging.
set -u
BIN=${1:-.build/release/banyan}; WRITES=${2:-150}; P=${3:-28600}
CLIENTS=8
D=$(mktemp -d /tmp/banyan-instr.XXXXXX)
trap 'for i in 1 2 3; do [ -f "$D/pid$i" ] && kill "$(cat "$D/pid$i")" 2>/dev/null; done; rm -rf "$D"' EXIT
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 2; }
# valgrind cannot read the DWARF of Swift binaries: count on a copy without debug sections.
strip -g -o "$D/banyan" "$BIN" || exit 2
mkdir -p "$D/certs"
# Long timeouts: every node runs about 50 times slower under callgrind.
printf 'raft:\n  election_ticks: 1500\n  heartbeat_ticks: 25\n' > "$D/c.yaml"
members=""
for i in 1 2 3; do members="$members --initial-member=$i=127.0.0.1:$((P + 10 + i))"; done
start() {
  valgrind --tool=callgrind --callgrind-out-file="$D/cg$1.out" --instr-atstart=no --dump-instr=no \
    "$D/banyan" serve --node-id "$1" --cluster-id instr --data-dir "$D/d$1" --listen "127.0.0.1:$((P + $1))" \
    --peer-listen "127.0.0.1:$((P + 10 + $1))" --tls-dir "$D/certs" --config "$D/c.yaml" $members --new-cluster \
    > "$D/log$1.txt" 2>&1 &
  echo $! > "$D/pid$1"
}
# Node 1 writes the development certificates the others then read.
start 1
for _ in $(seq 1 240); do [ "$(ls "$D/certs" | wc -l)" -ge 3 ] && break; sleep 1; done
sleep 5
start 2
start 3
leader=""
for _ in $(seq 1 150); do
  for i in 1 2 3; do
    curl -s -m 5 "http://127.0.0.1:$((P + i))/.banyan/ready" | grep -q '"role":"leader"' && leader=$i && break 2
  done
  sleep 2
done
[ -n "$leader" ] || { echo "no leader elected" >&2; exit 1; }
AS_CLIENTS=${AS_CLIENTS:-}
if [ -n "${RULES:-}" ]; then
  AS_CLIENTS=1
  code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT --data-binary @"$RULES" "http://127.0.0.1:$((P + leader))/.settings/rules.json?ns=bench&auth=owner")
  [ "$code" = 200 ] || { echo "setting the rules: HTTP $code" >&2; exit 1; }
fi
cat > "$D/load.py" << 'EOF'
import base64, http.client, os, sys, threading
port, n, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
as_clients = bool(os.environ.get("AS_CLIENTS"))
failed = []
def b64(text): return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
def client(t):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    token = b64('{"alg":"none","typ":"JWT"}') + "." + b64('{"sub":"c%d","user_id":"c%d"}' % (t, t)) + "." if as_clients else "owner"
    for i in range(n):
        body = '{"c":%d,"i":%d}' % (t, i) if as_clients else str(i)
        c.request("PUT", f"/bench/c{t}/k{i % 1000}.json?ns=bench&print=silent&auth={token}", body=body)
        r = c.getresponse(); r.read()
        if r.status != 204: failed.append(r.status)
ts = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
if failed: sys.exit(f"{len(failed)} writes failed: {failed[:5]}")
EOF
export AS_CLIENTS
python3 "$D/load.py" $((P + leader)) 100 $CLIENTS || exit 1
for i in 1 2 3; do callgrind_control -i on "$(cat "$D/pid$i")" > /dev/null 2>&1; done
python3 "$D/load.py" $((P + leader)) "$WRITES" $CLIENTS || exit 1
for i in 1 2 3; do
  callgrind_control -d "$(cat "$D/pid$i")" > /dev/null 2>&1
  callgrind_control -i off "$(cat "$D/pid$i")" > /dev/null 2>&1
done
writes=$((WRITES * CLIENTS))
total=0
for i in 1 2 3; do
  n=$(awk '/^totals:/ {print $2}' "$D/cg$i.out.1")
  total=$((total + n))
  role=follower; [ "$i" = "$leader" ] && role=leader
  echo "node $i ($role): $((n / writes)) instructions per write"
done
echo "cluster: $((total / writes)) instructions per write ($writes writes, $CLIENTS clients)"
if [ -n "${KEEP_PROFILES:-}" ]; then mkdir -p "$KEEP_PROFILES" && cp "$D"/cg*.out.1 "$KEEP_PROFILES"/ && echo "profiles in $KEEP_PROFILES"; fi
