#!/usr/bin/env bash
# Builds the fuzz targets (libFuzzer, AddressSanitizer, release) and runs each for a bounded
# time from its committed corpus; fails on any finding (crash, broken invariant, hang, or
# allocation over the limit). docs/testing.md, "Fuzzing".
#
#   Fuzz/run.sh [seconds-per-target] [target…]      e.g. Fuzz/run.sh 20; Fuzz/run.sh 3600 rest
#
# Targets: json rest query websocket peer log snapshot command rules (default: all).
# BANYAN_FUZZ_MERGE=1 merges what a run found into Fuzz/Corpus/<target> (minimised) afterwards.
# Findings go to Fuzz/Findings/<target>-crash-… (reproduce: the target's binary and the file).
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-30}
[ $# -gt 0 ] && shift
all=(json rest query websocket peer log snapshot command rules)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

product() {
  case $1 in
    json) echo FuzzJSON ;; rest) echo FuzzREST ;; query) echo FuzzQuery ;; websocket) echo FuzzWebSocket ;;
    peer) echo FuzzPeer ;; log) echo FuzzLog ;; snapshot) echo FuzzSnapshot ;; command) echo FuzzCommand ;;
    rules) echo FuzzRules ;;
    *) echo "unknown fuzz target '$1' (known: ${all[*]})" >&2; return 1 ;;
  esac
}

flags=(-c release --sanitize fuzzer -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library)
build_start=$SECONDS
build_log=$(mktemp)
for t in "${targets[@]}"; do
  swift build "${flags[@]}" --product "$(product "$t")" > "$build_log" 2>&1 || { cat "$build_log"; echo "error: $(product "$t") did not build" >&2; exit 1; }
done
rm -f "$build_log"
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - build_start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p Findings
failed=()
for t in "${targets[@]}"; do
  seeds=("Corpus/$t")
  [ "$t" = json ] && seeds+=("../Tests/Corpora/json-parsing")
  mkdir -p "$work/$t" "Corpus/$t"
  rm -f Findings/"$t"-*
  set +e
  # New inputs go to the scratch directory first; the committed corpus is only read.
  SWIFT_BACKTRACE=enable=no ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
    ".build/release/$(product "$t")" "$work/$t" "${seeds[@]}" \
    -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -artifact_prefix="Findings/$t-" -print_final_stats=1 > "$work/$t.log" 2>&1
  rc=$?
  set -e
  # The last status line's coverage (edges, features, corpus) and the final statistics.
  coverage=$(grep -E '^#[0-9]+' "$work/$t.log" | tail -1 | grep -oE '(cov|ft|corp): [^ ]+' | tr '\n' ' ' || true)
  runs=$(grep -oE 'number_of_executed_units: *[0-9]+' "$work/$t.log" | grep -oE '[0-9]+$' || true)
  rate=$(grep -oE 'average_exec_per_sec: *[0-9]+' "$work/$t.log" | grep -oE '[0-9]+$' || true)
  stats="${runs:-?} runs, ${rate:-?}/s, ${coverage}"
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc):"
    # The error, and the first frames of its stack.
    grep -aE 'Fatal error|ERROR: (AddressSanitizer|libFuzzer)|SUMMARY|^ +#[0-9] ' "$work/$t.log" | head -16 | cut -c1-400
    ls -1 Findings/"$t"-* 2>/dev/null | sed 's/^/  finding: Fuzz\//'
  else
    echo "fuzz: $t ok: $stats"
  fi
  if [ "${BANYAN_FUZZ_MERGE:-0}" = 1 ] && [ $rc -eq 0 ]; then
    SWIFT_BACKTRACE=enable=no ASAN_OPTIONS=detect_leaks=0 ".build/release/$(product "$t")" -set_cover_merge=1 -use_counters=0 -max_len=8192 \
      "Corpus/$t" "$work/$t" > "$work/$t.merge.log" 2>&1 && echo "fuzz: $t corpus merged ($(ls "Corpus/$t" | wc -l) inputs)"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (see Fuzz/Findings; docs/testing.md says how to turn one into a test)" >&2
  exit 1
fi
