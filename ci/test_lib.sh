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
finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
