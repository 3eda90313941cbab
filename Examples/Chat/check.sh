#!/usr/bin/env bash
# Checks the chat example end to end against a real node (docs/client-guide.md, "The example
# app"): starts `banyan serve` on a spare port and runs `banyan-chat` (built by `swift build`
# with the rest of the package) non-interactively:
#
#   1. carol says something while no server runs: her message waits in her offline cache;
#   2. the node starts; bob and ada join, each says hello: each sees the other's message and
#      both in the presence list;
#   3. carol starts again: her queued message goes out, once, and she joins the list;
#   4. ada leaves: the server's onDisconnect takes her off bob's list.
#
# Usage: Examples/Chat/check.sh [BANYAN [BANYAN_CHAT]]   (default .build/debug/banyan and the
# banyan-chat beside it)
# Environment: CHAT_CHECK_PORT (client port, default 32510; the peer port is 100 above it).
# Every wait is bounded; every process started here is stopped on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
banyan=${1:-$root/.build/debug/banyan}
chat=${2:-$(dirname "$banyan")/banyan-chat}
# Absolute: the node is started from a directory of its own (a relative path failed there in CI).
case "$banyan" in /*) ;; *) banyan="$PWD/$banyan" ;; esac
case "$chat" in /*) ;; *) chat="$PWD/$chat" ;; esac
port=${CHAT_CHECK_PORT:-32510}
peer=$((port + 100))
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
  echo "error: $*" >&2
  for f in "$work"/*.out; do echo "--- $(basename "$f")"; cat "$f"; done >&2
  exit 1
}
[ -x "$banyan" ] || fail "no banyan binary at $banyan (swift build first)"
[ -x "$chat" ] || fail "no banyan-chat binary at $chat (swift build first)"

url="http://127.0.0.1:$port?ns=chatcheck"
run_chat() { # name, output file, then chat arguments
  local name=$1 out=$2
  shift 2
  "$chat" --url "$url" --name "$name" --room check --cache "$work/cache" "$@" >"$work/$out" 2>&1 &
  pids+=($!)
}
# wait_for FILE TEXT [SECONDS]: until a line of FILE contains TEXT.
wait_for() {
  local file=$1 text=$2 seconds=${3:-60}
  for _ in $(seq 1 $((seconds * 10))); do
    grep -qF -- "$text" "$work/$file" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$file never showed '$text' within $seconds s"
}

echo "== 1. carol writes while no server runs =="
"$chat" --url "$url" --name carol --room check --cache "$work/cache" --say "written while the server was down" --exit-after 2 >"$work/carol-offline.out" 2>&1 ||
  fail "the offline chat failed"
grep -qF "carol: written while the server was down" "$work/carol-offline.out" || fail "carol did not see her own message at once"
grep -qF "kept in the cache" "$work/carol-offline.out" || fail "carol's message was not kept for later"

echo "== 2. the node starts; bob and ada join =="
mkdir -p "$work/node"
(cd "$work/node" && exec "$banyan" serve --listen "127.0.0.1:$port" --peer-listen "127.0.0.1:$peer" --log-level warning) >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/.banyan/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$port/.banyan/ready" >/dev/null || { cat "$work/serve.log" >&2; fail "the node did not become ready"; }
run_chat bob bob.out --say "hello from bob" --exit-after 120
wait_for bob.out "online: bob"
run_chat ada ada.out --say "hello from ada" --exit-after 120
ada_pid=${pids[-1]}
wait_for ada.out "bob: hello from bob"
wait_for bob.out "ada: hello from ada"
wait_for ada.out "online: ada, bob"
wait_for bob.out "online: ada, bob"

echo "== 3. carol comes back: her queued message goes out once =="
run_chat carol carol.out --exit-after 120
wait_for bob.out "carol: written while the server was down"
wait_for ada.out "online: ada, bob, carol"
wait_for bob.out "online: ada, bob, carol"

echo "== 4. ada leaves =="
kill -TERM "$ada_pid"
wait "$ada_pid" || true
grep -qF "* bye" "$work/ada.out" || fail "ada did not leave cleanly"
wait_for bob.out "online: bob, carol"

count=$(grep -cF "carol: written while the server was down" "$work/bob.out" || true)
[ "$count" -eq 1 ] || fail "bob saw carol's queued message $count times"
stored=$(curl -sf "http://127.0.0.1:$port/rooms/check/messages.json?ns=chatcheck")
n=$(printf '%s' "$stored" | grep -o '"written while the server was down"' | wc -l)
[ "$n" -eq 1 ] || fail "the server holds carol's queued message $n times: $stored"
for f in bob ada carol; do echo "--- $f"; cat "$work/$f.out"; done
echo "chat check passed"
