# Shared by the end-to-end test scripts (sourced): a temporary directory removed on exit,
# pass/fail counters, and `check NAME EXPECTED_RC PATTERN -- command...`, which runs the
# command, and passes when it exits with EXPECTED_RC and its output matches the extended
# regular expression PATTERN (an empty pattern matches anything). `finish` prints the tally
# and returns non-zero on any failure.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() {
  echo "FAIL $1"
  [ -f "$tmp/out" ] && sed 's/^/    /' "$tmp/out" | tail -8
  failures=$((failures + 1))
}
check() {
  local name=$1 want=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit $rc, expected $want"
  elif [ -n "$pattern" ] && ! grep -qE -- "$pattern" "$tmp/out"; then
    fail "$name: output lacks /$pattern/"
  else
    pass "$name"
  fi
}
# `serve_core BUILD_DIR`: later `stratbench` commands of the script run as forks of one
# stratbench-core that has loaded LibTorch (cli/serve.h): half a second of CPU less each on
# Debian's LibTorch. What a fork cannot carry (other OMP_*/LD_*/... values, namespaces, limits)
# still execs; `launch` always does. A check about the process itself (its pid, its command line)
# runs with STRATBENCH_CORE_SERVER= before the command. SB_NO_CORE_SERVER=1 turns it off.
serve_core() {
  [ "${SB_NO_CORE_SERVER:-0}" = 1 ] && return 0
  "$1/stratbench-core" __serve "$tmp/core.sock" $$ >/dev/null 2>"$tmp/core-server.log" &
  for _ in $(seq 1200); do  # loading LibTorch on a busy machine: up to a minute
    [ -S "$tmp/core.sock" ] && { export STRATBENCH_CORE_SERVER="$tmp/core.sock"; return 0; }
    kill -0 $! 2>/dev/null || break
    sleep 0.05
  done
  echo "note: no core server ($(cat "$tmp/core-server.log")): every command execs" >&2
}
# `wait_lock DIR`: waits (at most 30 s) until a run holds DIR's result lock and prints the pid
# it names; exit 1 where none did.
wait_lock() {
  for _ in $(seq 300); do
    [ -s "$1/.stratbench.lock" ] && { cat "$1/.stratbench.lock"; return 0; }
    sleep 0.1
  done
  return 1
}
finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
# `verify_rows RESULTS.csv LIMIT`: every row passes (or is skipped, or unsupported naming a
# dimension or a memory limit no plan fits), counted communication equals the prediction, every passing row has a memory
# prediction and the largest error against the measured peak is at most LIMIT (a fraction).
verify_rows() {
  python3 - "$1" "$2" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
limit = float(sys.argv[2])
bad = [r for r in rows if r["status"] not in ("pass", "unsupported", "skipped")]
uns = [r for r in rows if r["status"] == "unsupported" and "dimension" not in r["message"]
       and "no plan fits" not in r["message"]]
comm = [r for r in rows if r["status"] == "pass" and r["comm_bytes"] != r["predicted_comm_bytes"]]
worst, where, missing = 0.0, "", 0
for r in rows:
    if r["status"] != "pass":
        continue
    if not r["predicted_mem_bytes"]:
        missing += 1
        continue
    m, p = float(r["peak_mem_bytes"]), float(r["predicted_mem_bytes"])
    err = abs(p - m) / m if m else abs(p - m)
    if err > worst:
        worst, where = err, r["case"] + " " + r["strategy_id"]
passed = sum(r["status"] == "pass" for r in rows)
print(f"{len(rows)} rows, {passed} pass; failing: {len(bad)}; unsupported without a dimension: "
      f"{len(uns)}; comm mismatches: {len(comm)}; no memory prediction: {missing}; "
      f"worst memory error {worst:.2%} ({where})")
for r in (bad + uns)[:5]:
    print("  ", r["status"], r["case"], r["strategy_id"], r["message"][:200])
sys.exit(0 if passed > 0 and not bad and not uns and not comm and not missing and worst <= limit
         else 1)
PY
}
