#!/usr/bin/env bash
# End-to-end checks that careless and hostile input is exit 2 with a message naming the option,
# key or value, quickly, and with an earlier run's results left as they were (issue 15):
# numbers (NaN, infinity, signs, overflow), patterns that backtrack or are huge, settings that
# would be ignored (a misspelt params key, a case-level backend, duplicate keys), YAML alias
# bombs and sweeps, text that is not UTF-8, and answers that would be wrong (a checkpoint
# budget of 0). The suite reader's own cases are in harness/test/suite_test.cpp.
# Usage: ci/hostile_input_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# A small valid suite and an earlier run's results, which no refused run may touch.
cat > "$tmp/ok.yaml" <<'Y'
suite: ok
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: lin
    workload: linear
    shape: {input: [8, 16], out_features: 8}
    mesh: 2
    strategies: ["sharding/linear/sharded_tensor/colwise"]
Y
"$sb" run "$tmp/ok.yaml" --out "$tmp/keep" > /dev/null 2>&1
sum_before=$(cat "$tmp/keep"/results.* | md5sum)
unchanged() {
  [ "$(cat "$tmp/keep"/results.* | md5sum)" = "$sum_before" ] || { echo "results changed"; return 1; }
}
bad() {  # NAME PATTERN ARGS...: exit 2, the message matches, within 60 s, old results kept
  local name=$1 pattern=$2
  shift 2
  check "$name" 2 "$pattern" -- timeout 60 "$@"
  unchanged || fail "$name: the earlier results were changed"
}
suite() {  # NAME: writes $tmp/NAME.yaml from stdin
  cat > "$tmp/$1.yaml"
}
edit_first_row() {  # CSV PYTHON: runs PYTHON on the first row `r` (a dict) and writes it back
  python3 - "$1" "$2" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
r = rows[0]
exec(sys.argv[2])
w = csv.DictWriter(open(sys.argv[1], "w", newline=""), fieldnames=list(rows[0].keys()),
                   lineterminator="\n")
w.writeheader()
w.writerows(rows)
PY
}

# 1. Numbers on the command line.
bad "--min-time nan" "--min-time: expected a number of seconds in \(0, 3600\], got 'nan'" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --min-time nan
bad "--min-time inf" "got 'inf'" "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --min-time inf
bad "--seed -5" "--seed: expected a whole number of seed from 0 to 18446744073709551615, got '-5'" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --seed -5
bad "--repetitions 0" "from 1 to 100000, got '0'" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --repetitions 0
bad "--timeout -1" "--timeout: expected a number of seconds" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --timeout -1
bad "solve chunk --max-memory 1e30" "--max-memory: expected a whole number of bytes from 1 to 2\^62" \
  "$sb" solve chunk --workload gpt2_prefill --shape '{"seq": 64}' --max-memory 1e30
bad "report --mem-threshold nan" "--mem-threshold: expected a number of percent in \[0, 1000\], got 'nan'" \
  "$sb" report "$tmp/keep" --mem-threshold nan --no-plots
bad "report --perf-threshold 0" "--perf-threshold: expected a number of percent in \(0, 1000\]" \
  "$sb" report "$tmp/keep" --perf-threshold 0 --no-plots
bad "solve shard --mip-rel-gap nan" "--mip-rel-gap" \
  "$sb" solve shard --workload mlp --mesh 2x2 --mip-rel-gap nan
bad "launch -n 1000 on this host" "-n 1000: at most [0-9]+ ranks on this host" \
  "$sb" launch -n 1000 -- run "$tmp/ok.yaml" --backend gloo

# 2. Checkpoint budgets: 0 is not "none", NaN is bad input.
cat > "$tmp/chain.json" <<'J'
{"ftime": [1, 1, 1], "btime": [2, 2, 2, 1], "x": [4, 4, 4, 4], "xbar": [8, 8, 8, 4],
 "ftmp": [0, 0, 0], "btmp": [0, 0, 0, 0]}
J
bad "solve checkpoint --budget 0" "--budget: .*got '0'" \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget 0
bad "solve checkpoint --budget nan" "--budget: .*got 'nan'" \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget nan
check "solve checkpoint --budget none: the unconstrained schedule" 0 '"budget": null' -- \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget none
check "solve checkpoint: a schedule's peak is within its budget" 0 "within" -- bash -c "
  '$sb' solve checkpoint --chain '$tmp/chain.json' --budget 28 | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j[\"predicted_peak\"] <= 28, j
print(\"within\", j[\"predicted_peak\"])'"
# A long chain at many slots: rotor's tables are bounded in time (exit 1 saying how far it got)
# as they are in memory (exit 2), never minutes without a word.
python3 -c '
import json
L = 400
json.dump({"ftime": [1.0] * L, "btime": [2.0] * (L + 1), "x": [1000] * (L + 1),
           "xbar": [2000] * (L + 1), "ftmp": [0] * L, "btmp": [0] * (L + 1)}, open("'"$tmp"'/long.json", "w"))'
check "solve checkpoint past --time-limit: exit 1, saying how much was filled" 1 \
  "rotor: stopped at the time limit with [0-9.]+% of the table of a 400-stage chain" -- \
  "$sb" solve checkpoint --chain "$tmp/long.json" --budget 100000 --time-limit 0.001
bad "solve checkpoint --time-limit 0" "--time-limit: .*got '0'" \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget none --time-limit 0

# 3. Patterns: linear-time matching, bounded length.
bad "--filter '(.|.)*Z' ends at once" "selects no strategy" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --filter '(.|.)*Z'
long=$(python3 -c 'print("(a|b)" * 20000)')
bad "a 100 kB --filter" "--filter: the pattern is 100000 bytes long; at most 1000" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --filter "$long"
check "list --filter with a 100 kB pattern" 2 "at most 1000" -- "$sb" list --filter "$long"
bad "a lookahead (not RE2) names RE2's reason" "not a valid regular expression" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --filter '(?!x)lin'

# 4. Settings that would be ignored.
sed 's/    mesh: 2/    mesh: 2\n    params: {budgt: 0.5}/' "$tmp/ok.yaml" | suite misspelt
bad "a params key no strategy reads" \
  "misspelt.yaml:4: case 'lin': params key 'budgt' is read by none of its strategies that run it \(they read no parameters\)" \
  "$sb" run "$tmp/misspelt.yaml" --out "$tmp/keep"
cat > "$tmp/ckpt.yaml" <<'Y'
cases:
  - name: mlp
    workload: mlp_chain
    shape: {batch: 4, width: 16, depth: 4, dropout: 0.1}
    mesh: 1
    params: {budgt: 0.5}
    strategies: ["checkpointing/rotor"]
Y
bad "a misspelt checkpoint budget" "params key 'budgt' is read by none of its strategies that run it \(they read: budget\)" \
  "$sb" run "$tmp/ckpt.yaml" --out "$tmp/keep"
sed 's/    mesh: 2/    mesh: 2\n    backend: gloo/' "$tmp/ok.yaml" | suite backend
bad "a case-level backend" "key 'backend' is not a case key" \
  "$sb" run "$tmp/backend.yaml" --out "$tmp/keep"
sed 's/    mesh: 2/    mesh: 2\n    mesh: 4/' "$tmp/ok.yaml" | suite dup
bad "a duplicate key" "dup.yaml:8: key 'mesh' is given twice" "$sb" run "$tmp/dup.yaml" --out "$tmp/keep"

# 5. Unbounded work and text that is not UTF-8.
python3 - "$tmp/bomb.yaml" <<'PY'
import sys
lines = ["defaults:", "  params:", "    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
for i in range(1, 12):
    lines.append(f"    a{i}: &a{i} [" + ", ".join(f"*a{i-1}" for _ in range(10)) + "]")
lines += ["cases:", "  - name: lin", "    workload: linear",
          "    shape: {input: [8, 16], out_features: 8}", "    mesh: 2",
          "    strategies: [x]"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
bad "a YAML alias bomb" "more than 1000000 values" "$sb" run "$tmp/bomb.yaml" --out "$tmp/keep"
sed 's/    mesh: 2/    mesh: 2\n    sweep: {a: [1,2,3,4,5,6,7,8,9,10], b: [1,2,3,4,5,6,7,8,9,10], c: [1,2,3,4,5,6,7,8,9,10], d: [1,2,3,4,5,6,7,8,9,10, 11]}/' \
  "$tmp/ok.yaml" | suite sweep
bad "a sweep of 11000 cases" "the sweep makes more than 10000 cases" \
  "$sb" run "$tmp/sweep.yaml" --out "$tmp/keep"
sed "s/name: lin/name: lin$(printf '\xff')/" "$tmp/ok.yaml" | suite latin1
bad "a case name that is not UTF-8" "not UTF-8 text: byte 0xff" \
  "$sb" run "$tmp/latin1.yaml" --out "$tmp/keep"

# 6. Result files: one run per output folder, and the previous set whole until the new one is.
# (Exec'd, not served: the lock names the run's pid, which must be the one started here.)
STRATBENCH_CORE_SERVER= "$sb" run "$tmp/ok.yaml" --out "$tmp/busy" --repetitions 3 --min-time 1 \
  > /dev/null 2>&1 &
first=$!
wait_lock "$tmp/busy" >/dev/null
check "a second run into the same --out is refused, naming the first" 2 \
  "is in use by another run \(pid $first\)" -- "$sb" run "$tmp/ok.yaml" --out "$tmp/busy"
wait "$first"
check "a finished run leaves no lock file in its folder" 0 "" -- bash -c "[ ! -e '$tmp/busy/.stratbench.lock' ]"
check "the first run's files are one set" 0 "" -- python3 - "$tmp/busy" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/results.csv")))
doc = json.load(open(sys.argv[1] + "/results.json"))
assert len(rows) == len(doc["records"]) == 1, (len(rows), len(doc["records"]))
assert {r["run_id"] for r in rows} == {doc["run"]["run_id"]}
PY
sum_keep=$(cat "$tmp/busy"/results.csv "$tmp/busy"/results.json | md5sum)
"$sb" run "$tmp/ok.yaml" --out "$tmp/busy" --repetitions 3 --min-time 1 > /dev/null 2>&1 &
second=$!
wait_lock "$tmp/busy" >/dev/null && sleep 1
kill -TERM "$second"  # (a background job of a script ignores SIGINT)
wait "$second"
check "an interrupted run leaves the previous set as it was" 0 "" -- bash -c \
  "[ \"\$(cat '$tmp/busy'/results.csv '$tmp/busy'/results.json | md5sum)\" = '$sum_keep' ]"

# Promises judged on measurements (class 8). The first row of a process is judged like any
# other: LibTorch settles its thread count before the first reference (with OMP_NUM_THREADS
# unset this row failed bitwise once). A checkpoint budget is a promise on the measured peak:
# the same solver ignoring it fails with right numbers; honest, it passes with the
# prediction equal to the measurement.
cat > "$tmp/budget.yaml" <<'Y'
cases:
  - name: mlp
    workload: mlp_chain
    shape: {batch: 32, width: 128, depth: 12, dropout: 0.1}
    mesh: 1
    params: {budget: 0.3}
    strategies: ["checkpointing/rotor"]
    repetitions: 1
    min_time_s: 0.0001
Y
check "the first row of a process passes bitwise, OMP_NUM_THREADS unset" 0 "total +1 +0 +0 +0" -- \
  env -u OMP_NUM_THREADS "$sb" run "$tmp/budget.yaml" --out "$tmp/budget"
check "the honest schedule's peak is its prediction, within its budget" 0 "" -- python3 - \
  "$tmp/budget/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["records"][0]
limit = r["details"]["memory_limit_bytes_per_rank"][0]
assert r["status"] == "pass" and r["mispredicted"] == "", r["message"]
assert r["peak_mem_bytes"] == r["predicted_mem_bytes"] <= limit, (r["peak_mem_bytes"], limit)
PY
check "planted: a schedule over its budget fails on the measured peak" 1 \
  "bytes it promised to stay within" -- "$sb" run "$tmp/budget.yaml" --out "$tmp/budget-fault" \
  --plant-fault 'checkpointing/rotor=ignore_budget'

# report writes one set: interrupted while its plots are drawn (SIGTERM), the previous
# report stays exactly as it was; the next report clears the dead one's staging folder.
"$sb" report "$tmp/budget" --out "$tmp/rep" --no-plots >/dev/null 2>&1
snapshot() { (cd "$tmp/rep" && find . -path ./.report.new.\* -prune -o -type f -print0 | sort -z |
  xargs -0 md5sum); }
snapshot >"$tmp/rep.before"
printf '#!/bin/sh\nsleep 5\n' >"$tmp/slowpy" && chmod +x "$tmp/slowpy"
STRATBENCH_PYTHON="$tmp/slowpy" "$sb" report "$tmp/budget-fault" --out "$tmp/rep" >/dev/null 2>&1 &
reporter=$!
staged=0  # killed only once the new set is being staged (its plots are being drawn)
for _ in $(seq 150); do
  ls -A "$tmp/rep" | grep -q '^\.report\.new\.' && { staged=1; break; }
  sleep 0.1
done
kill -TERM "$reporter"
wait "$reporter" 2>/dev/null
check "an interrupted report leaves the previous set as it was" 0 "" -- \
  bash -c "[ $staged = 1 ] && diff <(cd '$tmp/rep' && find . -path ./.report.new.\* -prune -o \
    -type f -print0 | sort -z | xargs -0 md5sum) '$tmp/rep.before'"
check "the next report clears the dead one's staging folder and writes its set" 0 "" -- \
  bash -c "'$sb' report '$tmp/budget-fault' --out '$tmp/rep' --no-plots >/dev/null &&
    ! ls -a '$tmp/rep' | grep -q report.new &&
    grep -q 'promised to stay within' '$tmp/rep/summary.csv'"

# A report folder the set cannot be moved into whole (plots/ is a file): exit 2 before any
# file is moved, the previous report kept.
"$sb" report "$tmp/budget" --out "$tmp/rep2" --no-plots >/dev/null 2>&1
rm -rf "$tmp/rep2/plots" && touch "$tmp/rep2/plots"
(cd "$tmp/rep2" && md5sum summary.csv report.html) >"$tmp/rep2.sums"
check "a report whose plots/ is a file is refused before moving anything" 2 \
  "plots is not a folder the report can be written to" -- \
  "$sb" report "$tmp/budget-fault" --out "$tmp/rep2" --no-plots
check "the refused report left the previous one as it was" 0 "" -- \
  bash -c "cd '$tmp/rep2' && md5sum -c --quiet '$tmp/rep2.sums' && ! ls -A | grep -q report.new"

# 7. Second round (issue 34): the commands added since the first.
# Overwriting: --out replaces only a regular file (or nothing); a FIFO, a folder, a symbolic
# link to a FIFO are refused before any work, with no *.tmp.PID left behind.
mkfifo "$tmp/fifo"
ln -s "$tmp/fifo" "$tmp/to-fifo"
mkdir -p "$tmp/outdir"
for target in fifo to-fifo outdir; do
  check "solve shard --out $target is refused" 2 "only a regular file or a new path" -- \
    timeout 60 "$sb" solve shard --workload mlp --mesh 2 --out "$tmp/$target"
done
check "calibrate --out a FIFO is refused" 2 "is a FIFO" -- \
  timeout 60 "$sb" calibrate --mesh 2 --out "$tmp/fifo"
check "a refused --out leaves no temporary file" 0 "" -- \
  bash -c "! ls '$tmp' '$tmp/outdir' | grep -q '\.tmp\.'"
check "solve shard --out through a link to a regular file writes the file" 0 "" -- bash -c \
  "echo old > '$tmp/plan-target.json' && ln -sf '$tmp/plan-target.json' '$tmp/plan-link.json' &&
   '$sb' solve shard --workload mlp --mesh 2 --out '$tmp/plan-link.json' 2>/dev/null &&
   [ -L '$tmp/plan-link.json' ] && grep -q '\"choices\"\|\"nodes\"\|\"solver\"' '$tmp/plan-target.json'"

# Crashes: a symlink loop on the plugin path and under --history, costs past CBC's range,
# a suite's time_limit 0, a huge mesh, a misspelt graph shape key in a suite.
mkdir -p "$tmp/loop"
ln -s "$tmp/loop/a" "$tmp/loop/b" && ln -s "$tmp/loop/b" "$tmp/loop/a"
check "a symlink loop in a STRATBENCH_PLUGIN_PATH folder is no crash" 0 "" -- \
  env STRATBENCH_PLUGIN_PATH="$tmp/loop" timeout 60 "$sb" list --family sharding
check "--plugin given a symlink loop says so, not 'no such file'" 2 "Too many levels of symbolic links" -- \
  timeout 60 "$sb" list --plugin "$tmp/loop/a"
mkdir -p "$tmp/hist" && cp -r "$tmp/budget" "$tmp/hist/run1"
ln -s "$tmp/hist/x" "$tmp/hist/y" && ln -s "$tmp/hist/y" "$tmp/hist/x"
check "a symlink loop under report --history is no crash" 0 "" -- \
  timeout 60 "$sb" report "$tmp/budget" --history "$tmp/hist" --out "$tmp/rep-loop" --no-plots
mkdir -p "$tmp/hist/run2" && mkfifo "$tmp/hist/run2/results.csv"
check "a run under --history whose results.csv is a FIFO is left out, said" 0 \
  "leaving out .*run2.*not a regular file" -- \
  timeout 60 "$sb" report "$tmp/budget" --history "$tmp/hist" --out "$tmp/rep-loop" --no-plots
bad "report --out '' is exit 2, not the default folder" "--out: expected a path, got an empty string" \
  "$sb" report "$tmp/keep" --out '' --no-plots
bad "run --out '' is exit 2" "--out: expected a path, got an empty string" \
  "$sb" run "$tmp/ok.yaml" --out ''
bad "solve shard --intra-node-bandwidth 1e-300" "--intra-node-bandwidth: expected a number of GB/s in \[1e-06, 1e\+06\]" \
  "$sb" solve shard --workload mlp --mesh 2x2 --intra-node-bandwidth 1e-300
bad "solve shard --mesh 65536x65536" "--mesh '65536x65536'.*more than 4096 ranks" \
  "$sb" solve shard --workload mlp --mesh 65536x65536
bad "calibrate --mesh 2000 (threads)" "--mesh: .*more than 64 ranks" \
  "$sb" calibrate --mesh 2000 --out "$tmp/cal.json"
cat > "$tmp/ilp0.yaml" <<'Y'
cases:
  - name: m
    workload: mlp
    shape: {layers: 2}
    mesh: 2
    params: {time_limit: 0}
    strategies: ["sharding/auto/ilp"]
Y
bad "a suite's time_limit 0" "params.time_limit: expected a number of seconds in \(0, 86400\], got 0" \
  "$sb" run "$tmp/ilp0.yaml" --out "$tmp/keep"
sed 's/shape: {layers: 2}/shape: {layrs: 2}/; s/params: {time_limit: 0}/params: {}/' "$tmp/ilp0.yaml" | suite mlpkey
bad "a misspelt mlp shape key in a suite" "mlpkey.yaml:4: .*unknown shape key 'layrs'" \
  "$sb" run "$tmp/mlpkey.yaml" --out "$tmp/keep"

# Wrong answers: a family's plan whose cost passes 1e9 us is still its plan; max_memory 1e30;
# a chunk search whose scores overflow int64; calibrate on one size.
check "solve shard --algo replicated on a 24-layer GPT-2: a plan, not 'no plan fits 0 bytes'" 0 \
  '"algo": "replicated"' -- timeout 120 "$sb" solve shard --workload gpt2 \
  --shape '{"layers": 24, "d_model": 1024, "seq": 1024, "batch": 32}' --mesh 2 --algo replicated
sed 's/params: {time_limit: 0}/params: {max_memory: 1e30}/' "$tmp/ilp0.yaml" | suite maxmem
bad "a suite's max_memory 1e30" "params.max_memory: expected a whole number of bytes from 0 to 2\^62" \
  "$sb" run "$tmp/maxmem.yaml" --out "$tmp/keep"
bad "solve chunk on a shape whose scores overflow int64" "--shape: .*(2\^56|at most 1048576)" \
  "$sb" solve chunk --workload gpt2_prefill --shape '{"seq": 1000000, "batch": 100000}' --max-memory 1e9
bad "calibrate --max-bytes 1024 (one size: no bandwidth)" "--max-bytes: expected a whole number of bytes from 4096" \
  "$sb" calibrate --mesh 2 --max-bytes 1024 --out "$tmp/cal.json"

# Unbounded time: --compare-anchors stops at its limit with exit 1, saying how far it got.
check "solve redistribute --compare-anchors on 2x2x2 stops at --time-limit" 1 \
  "stopped at the time limit .* of [0-9]+ ordered pairs" -- timeout 60 "$sb" solve redistribute \
  --shape '[8,8,8]' --mesh 2x2x2 --compare-anchors --time-limit 2

# Silent acceptance: duplicate JSON keys, a profile missing a group or of another schema.
bad "graph --shape with a duplicate key" "--shape: key 'layers' is given twice" \
  "$sb" graph --workload mlp --shape '{"layers": 2, "layers": 3}'
bad "solve shard --shape with a duplicate key" "--shape: key 'layers' is given twice" \
  "$sb" solve shard --workload mlp --mesh 2 --shape '{"layers": 2, "layers": 3}'
python3 - "$src/ci/fuzz/corpus/profile/mesh2.json" "$tmp" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for name, change in [("v19", lambda j: j.update(schema_version=1.9)),
                     ("vbig", lambda j: j.update(schema_version=4294967297)),
                     ("nogroup", lambda j: j.update(groups={})),
                     ("lat308", lambda j: [f.update(latency_us=1e308) for g in j["groups"].values()
                                           for f in g["collectives"].values()])]:
    j = json.loads(json.dumps(p))
    change(j)
    json.dump(j, open(f"{sys.argv[2]}/profile-{name}.json", "w"))
PY
bad "a profile of schema_version 1.9" "schema_version 1.9 is not 1" \
  "$sb" solve shard --workload mlp --mesh 2 --profile "$tmp/profile-v19.json"
bad "a profile of schema_version 4294967297" "schema_version 4294967297 is not 1" \
  "$sb" solve shard --workload mlp --mesh 2 --profile "$tmp/profile-vbig.json"
bad "a profile missing a group" "group \"0\" of mesh 2 is missing" \
  "$sb" solve shard --workload mlp --mesh 2 --profile "$tmp/profile-nogroup.json"
bad "a profile with latencies of 1e308" "latency_us' must be a number of microseconds from 0 to 1e\+09" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --cost-profile "$tmp/profile-lat308.json"
sed 's/params: {time_limit: 0}/params: {mip_rel_gap: 1e9}/' "$tmp/ilp0.yaml" | suite gap
bad "a suite's mip_rel_gap 1e9" "params.mip_rel_gap: expected a number of percent in \[0, 100\]" \
  "$sb" run "$tmp/gap.yaml" --out "$tmp/keep"

# Results: a case name that starts with = reaches summary.csv defused.
sed "s/name: lin/name: '=1+1'/" "$tmp/ok.yaml" | suite formula
"$sb" run "$tmp/formula.yaml" --out "$tmp/formula" >/dev/null 2>&1
check "summary.csv defuses a cell that starts with =" 0 "" -- bash -c \
  "'$sb' report '$tmp/formula' --out '$tmp/formula-rep' --no-plots >/dev/null &&
   grep -q \"'=1+1\" '$tmp/formula-rep/summary.csv' && ! grep -q ',=1+1' '$tmp/formula-rep/summary.csv'"

# A long solve says so on a terminal (`script` gives it one), and writes nothing of it to a
# log: a 48-layer GPT-2 on 4x4 under a memory limit that binds keeps CBC at its time limit
# (what it has found by then decides between a plan, exit 0, and none that fits by the replay
# of its step, exit 1: either is a finished solve; a crash or bad input is neither).
long_shard=("$sb" solve shard --workload gpt2 --mesh 4x4 --time-limit 4 --max-memory 7.3e9
  --shape '{"layers": 48, "d_model": 1024, "heads": 16, "seq": 1024, "batch": 8}')
check "solve shard: progress on a terminal while CBC runs" 0 \
  "ilp solving \(CBC stops at --time-limit 4 s\), [0-9]+ s" -- bash -c \
  'script -qec "$1" /dev/null; rc=$?; [ "$rc" -le 1 ]' _ \
  "${long_shard[*]@Q} --out $tmp/long-plan.json"
check "solve shard: no progress line where stderr is not a terminal" 0 "quiet" -- bash -c \
  '"$@" --out "'"$tmp"'/long-plan2.json" 2>&1 | { ! grep -q "ilp solving"; } && echo quiet' _ \
  "${long_shard[@]}"

# A chain workload validated without building it: a width of a million is terabytes of weights.
printf 'suite: big\ncases:\n  - name: c\n    workload: mlp_chain\n    shape: {width: 1123428}\n    mesh: 1\n    strategies: ["checkpointing/.*"]\n' >"$tmp/big-chain.yaml"
check "mlp_chain too large to build: exit 2 naming the keys, nothing allocated" 2 \
  "big-chain.yaml:[0-9]+: .*mlp_chain: shape keys batch 16, width 1123428, depth 8 make more than 2\^40 elements" -- \
  "$sb" run "$tmp/big-chain.yaml" --out "$tmp/big-chain"

# A graph shape whose derived dimension (batch x seq) passes every key's own check but not the
# operators' bound: named in the shape's keys, not an operator's (the graph fuzzer's finding).
check "graph: batch x seq over 2^24: exit 2 naming the keys" 2 \
  "gpt2: shape batch x seq \(26835456\) is over 2\^24" -- \
  "$sb" graph --workload gpt2 --shape '{"batch": 1677216}'

# A results.json whose communication per node is malformed or hostile (wrong types, ranks at
# the integer limits, markup in a node's name, figures that differ by less than the rounding):
# the report is written, every name escaped, and 4096 against 4100 bytes marked as differing.
python3 - "$tmp/budget" "$tmp/hostile-comm" <<'PY'
import json, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
p = sys.argv[2] + "/results.json"
d = json.load(open(p))
junk = [None, 5, "x", [1, 2], {"rank": "a", "nodes": 3},
        {"rank": 2**62, "predicted_per_node": "yes",
         "nodes": [1, {"node": 5, "phase": [], "counted": {"all_reduce": {"calls": "a"}},
                       "predicted": 7}]}]
near = {"rank": 2**63 - 1, "predicted_per_node": True,
        "nodes": [{"node": "</details><script>x</script>", "phase": "forward",
                   "counted": {"all_reduce": {"calls": 1, "bytes": 4096}},
                   "predicted": {"all_reduce": {"calls": 1, "bytes": 4100}}}]}
for i, r in enumerate(d["records"]):
    r["details"]["comm_by_node"] = junk[i % len(junk)] if i % 2 else junk[3:] + [near]
json.dump(d, open(p, "w"))
PY
check "report on a hostile comm_by_node: written, markup escaped, rounding not hiding a difference" \
  0 "^escaped$" -- bash -c '
  "$1" report "$2" --out "$2/rep" --no-plots >/dev/null 2>&1 || exit 1
  h="$2/rep/report.html"
  [ "$(grep -c "<script>" "$h")" = 1 ] && grep -q "&lt;/details&gt;&lt;script&gt;" "$h" &&
  grep -q "<summary class=\"fail\">.*part first at &lt;/details&gt;" "$h" &&
  ! grep -q "<script>x" "$2/rep/report.md" && echo escaped' _ "$sb" "$tmp/hostile-comm"

# LibTorch's own checks carry a C++ backtrace in their text: the commands print the message alone.
check "a LibTorch check's message without its backtrace" 0 "clean" -- bash -c \
  '"$1" solve shard --workload gpt2 --mesh 65536x65536 2>&1 | { ! grep -q "Exception raised from\|frame #"; } && echo clean' _ "$sb"

# ---- Damage (issue 60): nothing the user owns is written through, replaced or removed -----------
# report: a plots/ that is a symbolic link is refused (the linked folder's files untouched, even
# with --no-plots); a file of the user's in a real plots/ survives reports that prune their own.
mkdir -p "$tmp/pictures" "$tmp/rep-link" && echo mine > "$tmp/pictures/holiday.png"
ln -s "$tmp/pictures" "$tmp/rep-link/plots"
check "a report whose plots/ is a symbolic link is refused, naming it" 2 \
  "plots is a symbolic link" -- "$sb" report "$tmp/keep" --out "$tmp/rep-link" --no-plots
check "the linked folder's pictures are untouched" 0 "^mine$" -- cat "$tmp/pictures/holiday.png"
"$sb" report "$tmp/keep" --out "$tmp/rep-own" >/dev/null 2>&1
ls "$tmp"/rep-own/plots/time_*.png >/dev/null 2>&1 && pass "the first report drew its plots" ||
  fail "the first report drew no plots (the pruning check below would prove nothing)"
echo mine > "$tmp/rep-own/plots/mine.png"
check "a second report prunes only what the first wrote" 0 "^mine$" -- bash -c \
  '"$1" report "$2" --out "$3" --no-plots >/dev/null && cat "$3/plots/mine.png" &&
   ! ls "$3"/plots/time_*.png 2>/dev/null' _ "$sb" "$tmp/keep" "$tmp/rep-own"
# --write-golden: never the suite file, never a file it did not write; names with a comma or a
# leading '#' round-trip through its own reader; a reference that diverges is the reference's.
gold() {  # gold NAME GOLDEN CASE_NAME LR [STEPS]: a one-case training suite
  cat > "$tmp/$1.yaml" <<Y
suite: $1
golden: $2
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: '$3'
    workload: mlp
    shape: {batch: 4, d_model: 8, layers: 1}
    mesh: 2
    steps: ${5:-2}
    optimizer: {kind: sgd, lr: $4}
    strategies: ["sharding/fsdp/ddp"]
Y
}
gold gself gself.yaml plain 0.01
cp "$tmp/gself.yaml" "$tmp/gself.copy"
check "golden: naming the suite file itself is exit 2, the suite untouched" 2 \
  "names the suite file itself" -- "$sb" run "$tmp/gself.yaml" --write-golden --out "$tmp/g1"
cmp -s "$tmp/gself.yaml" "$tmp/gself.copy" && pass "the suite file is as it was" ||
  fail "the suite file changed"
gold gother notes.txt plain 0.01
echo "my notes" > "$tmp/notes.txt"
check "golden: a file it did not write is exit 2, left as it was" 2 \
  "replaces only a golden losses file it wrote" -- \
  "$sb" run "$tmp/gother.yaml" --write-golden --out "$tmp/g2"
check "the notes are as they were" 0 "^my notes$" -- cat "$tmp/notes.txt"
gold gcomma gcomma.csv '#a,"b"' 0.01
check "golden: a case named '#a,\"b\"' written, then read back and compared" 0 \
  "total +1 +0 +0 +0" -- bash -c '"$1" run "$2" --write-golden --out "$3/g3" >/dev/null &&
  "$1" run "$2" --out "$3/g4"' _ "$sb" "$tmp/gcomma.yaml" "$tmp"
gold gnan gnan.csv diverge 10 40
check "golden: a reference whose loss is not finite errors its row, saying so" 1 \
  "(loss|norm) at step [0-9]+ is -?(nan|inf)" -- \
  bash -c '"$1" run "$2" --write-golden --out "$3/g5" >/dev/null; cat "$3/g5/results.csv"; exit 1' \
  _ "$sb" "$tmp/gnan.yaml" "$tmp"
# --trace: a suite and a case named ".." stay inside DIR.
sed -e 's/^suite: ok/suite: ".."/' -e 's/name: lin/name: ".."/' "$tmp/ok.yaml" > "$tmp/dots.yaml"
mkdir -p "$tmp/tr/a/b"
check "--trace with names '..': every file inside DIR" 0 "inside" -- bash -c \
  '"$1" run "$2" --trace "$3/tr/a/b/t" --out "$3/tr-out" >/dev/null &&
   [ -z "$(find "$3/tr" -name "*.trace.json" -not -path "$3/tr/a/b/t/*")" ] &&
   [ -n "$(find "$3/tr/a/b/t" -name "*.trace.json")" ] && echo inside' _ "$sb" "$tmp/dots.yaml" "$tmp"
# Crashes (issue 60): a value of the wrong type where a parser expected another is exit 2 naming
# it, in a suite's shape and in a results.json the report reads, never an abort.
cat > "$tmp/ts-type.yaml" <<'Y'
suite: ts
cases:
  - name: a
    workload: torchscript
    shape: {file: /nonexistent.pt, inputs: [{shape: [4, 16], dtype: 5, low: 0, high: 64}]}
    mesh: 1
    strategies: ["sharding/fsdp/ddp"]
Y
check "a torchscript input's dtype: 5 is exit 2 naming it" 2 "inputs\[0\]\.dtype: expected" -- \
  "$sb" run "$tmp/ts-type.yaml" --out "$tmp/ts-type"
for junk in '"x"' '{"found": "yes"}' '{"found": true, "ranks": ["a"]}' '{"check": 5}'; do
  rm -rf "$tmp/div" && cp -r "$tmp/keep" "$tmp/div"
  python3 - "$tmp/div/results.json" "$junk" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    r["details"]["first_divergence"] = json.loads(sys.argv[2])
json.dump(d, open(sys.argv[1], "w"))
PY
  check "report on first_divergence $junk: exit 2 naming the key" 2 \
    "details.first_divergence.*expected" -- "$sb" report "$tmp/div" --out "$tmp/div/rep" --no-plots
done
# GLOO_SOCKET_IFNAME naming no interface: every rank exit 2 naming it (gloo aborted them).
check "GLOO_SOCKET_IFNAME naming no interface: exit 2 naming it" 2 \
  "GLOO_SOCKET_IFNAME='nosuch0': no such network interface on this host \(it has: lo" -- \
  env GLOO_SOCKET_IFNAME=nosuch0 timeout 120 "$sb" launch -n 2 -- run "$tmp/ok.yaml" \
  --backend gloo --out "$tmp/gloo-if"
# A results.json of another schema is refused, naming it (it was read silently).
rm -rf "$tmp/schema" && cp -r "$tmp/keep" "$tmp/schema"
python3 - "$tmp/schema/results.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["schema_version"] = 99
json.dump(d, open(sys.argv[1], "w"))
PY
check "report on a results.json of schema_version 99: exit 2 naming it" 2 \
  "results.json: schema_version 99: expected [0-9]+" -- \
  "$sb" report "$tmp/schema" --out "$tmp/schema/rep" --no-plots
# results.json disagreeing with results.csv on which records there are, or wrong-typed where
# the report reads it: exit 2 naming it (rows without a record, or with a wrong-typed one,
# were skipped: exit 0). A results.json that is a FIFO is said, not skipped.
for edit in emptied renamed duplicated details_null per_rank_strings esc_detail rlo_key deep; do
  rm -rf "$tmp/agree" && cp -r "$tmp/keep" "$tmp/agree"
  python3 - "$tmp/agree/results.json" "$edit" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["records"]
edit = sys.argv[2]
if edit == "emptied": d["records"] = []
if edit == "renamed": r[0]["case"] = "other"
if edit == "duplicated": r.append(r[0])
if edit == "details_null": r[0]["details"] = None
if edit == "per_rank_strings": r[0]["details"]["peak_mem_bytes_per_rank"] = ["1", "2"]
if edit == "esc_detail": r[0]["details"]["note"] = ["fine", "\x1b]8;;http://evil\x07link"]
if edit == "rlo_key": r[0]["details"]["a\u202eb"] = 1
if edit == "deep":
    x = 0
    for _ in range(100):
        x = [x]
    r[0]["details"]["deep"] = x
json.dump(d, open(sys.argv[1], "w"))
PY
  case $edit in
    emptied) want="has 0 records of run" ;;
    renamed) want="has 0 records of run|has no row in" ;;
    duplicated) want="has 2 records of run" ;;
    details_null) want="records\[0\]\.details: expected an object, got null" ;;
    per_rank_strings) want="peak_mem_bytes_per_rank\[\]: expected a number of bytes" ;;
    esc_detail) want="records\[0\]\.details\.note\[\]: the string holds the control character 0x1b" ;;
    rlo_key) want="records\[0\]\.details: a key holds a text-direction character U\+202E" ;;
    deep) want="records\[0\]\.details\.deep(\[\])+: expected at most 64 levels of nesting" ;;
  esac
  check "report on a results.json $edit: exit 2 naming it" 2 "$want" -- \
    "$sb" report "$tmp/agree" --out "$tmp/agree/rep" --no-plots
done
# Hand-edited results.csv fields no run writes: refused naming the column, never gated on.
for edit in err_ratio atol min_over_max dtype timestamp repetitions mispredicted mesh; do
  rm -rf "$tmp/edited" && cp -r "$tmp/keep" "$tmp/edited" && rm "$tmp/edited/results.json"
  case $edit in
    err_ratio) edit_first_row "$tmp/edited/results.csv" 'r["err_ratio"] = "-1"' ;;
    atol) edit_first_row "$tmp/edited/results.csv" 'r["atol"] = "-1e-05"' ;;
    min_over_max) edit_first_row "$tmp/edited/results.csv" 'r["time_us_min"] = "1e9"' ;;
    dtype) edit_first_row "$tmp/edited/results.csv" 'r["dtype"] = "float128"' ;;
    timestamp) edit_first_row "$tmp/edited/results.csv" 'r["timestamp_utc"] = "yesterday"' ;;
    repetitions) edit_first_row "$tmp/edited/results.csv" 'r["repetitions"] = "50"' ;;
    # A hand's "none missed" written as a word: read as a prediction named "false" it would
    # fail the gate saying that prediction missed.
    mispredicted) edit_first_row "$tmp/edited/results.csv" 'r["mispredicted"] = "false"' ;;
    mesh) edit_first_row "$tmp/edited/results.csv" 'r["mesh"] = "99999x99999"' ;;
  esac
  case $edit in
    err_ratio) want="column 'err_ratio': '-1' is not 0 or more" ;;
    atol) want="column 'atol': '-1e-05' is not 0 or more" ;;
    min_over_max) want="column 'time_us_min' \(1e9\) is above" ;;
    dtype) want="column 'dtype': 'float128' is not one of" ;;
    timestamp) want="column 'timestamp_utc': 'yesterday' is not a UTC time as run writes it" ;;
    repetitions) want="column 'time_us_samples' holds 1 sample\(s\) but 'repetitions' is 50" ;;
    mispredicted) want="column 'mispredicted': 'false' is not empty \(none missed\)" ;;
    mesh) want="column 'mesh': '99999x99999' is not a mesh as run writes it" ;;
  esac
  check "report on a results.csv with $edit edited: exit 2 naming the column" 2 "$want" -- \
    "$sb" report "$tmp/edited" --out "$tmp/edited/rep" --no-plots
done
rm -rf "$tmp/agree" && cp -r "$tmp/keep" "$tmp/agree" && rm "$tmp/agree/results.json" &&
  mkfifo "$tmp/agree/results.json"
check "report beside a results.json that is a FIFO: exit 2 at once" 2 "results.json: .*not a regular" -- \
  timeout 20 "$sb" report "$tmp/agree" --out "$tmp/agree/rep" --no-plots
# A case named like mathtext ("$x_{1$") is drawn as text: every plot of the report is there.
sed "s/name: lin/name: '\$x_{1\$'/" "$tmp/ok.yaml" > "$tmp/math.yaml"
check "a case named '\$x_{1\$': its plots drawn" 0 "^drawn$" -- bash -c \
  '"$1" run "$2" --out "$3" >/dev/null && "$1" report "$3" >/dev/null 2>"$3/err" &&
   ls "$3"/plots/time_*.png "$3"/plots/errors_*.png >/dev/null && ! grep -qi "plot.*fail\|missing" "$3/err" &&
   echo drawn' _ "$sb" "$tmp/math.yaml" "$tmp/math"
printf 'suite: "a\\u0007b"\ncases: []\n' > "$tmp/bell.yaml"
check "a suite name with a control character is exit 2 naming key 'suite'" 2 "key 'suite'" -- \
  "$sb" run "$tmp/bell.yaml" --out "$tmp/bell"

# --- issue 60, third round: injection, names, silent acceptance, unbounded waits ---
# report.md shows names, never runs them: no raw HTML, no link from a case name.
sed "s/name: lin/name: '<script>alert(1)<\/script>[x](javascript:alert(1))'/" "$tmp/ok.yaml" > "$tmp/inject.yaml"
check "report.md escapes a case name's HTML and link" 0 "^escaped$" -- bash -c \
  '"$1" run "$2" --out "$3" >/dev/null && "$1" report "$3" --no-plots >/dev/null &&
   ! grep -q "<script>" "$3/report.md" && ! grep -q "](javascript:" "$3/report.md" &&
   grep -q "\\\\<script\\\\>" "$3/report.md" && ! grep -q "<script>alert" "$3/report.html" &&
   echo escaped' _ "$sb" "$tmp/inject.yaml" "$tmp/inject"
# A right-to-left override makes a name read as another: refused like a control character.
printf 'suite: rtl\ncases:\n  - name: "abc\\u202Egpj.exe"\n    workload: linear\n    shape: {input: [8, 16], out_features: 8}\n    mesh: 2\n    strategies: ["sharding/linear/sharded_tensor/colwise"]\n' > "$tmp/rtl.yaml"
bad "a case name with a right-to-left override is exit 2 naming key 'name'" \
  "key 'name' must not hold Unicode control, invisible or text-direction characters \(U\+202E" \
  "$sb" run "$tmp/rtl.yaml" --out "$tmp/rtl"
# So does an invisible one: "smo<ZWSP>ke" shows as "smoke" (zero-width space, BOM, soft hyphen).
for cp in 200B FEFF 00AD 2060 2028; do
  printf 'suite: zw\ncases:\n  - name: "smo\\u%ske"\n    workload: linear\n    shape: {input: [8, 16], out_features: 8}\n    mesh: 2\n    strategies: ["sharding/linear/sharded_tensor/colwise"]\n' "$cp" > "$tmp/zw.yaml"
  bad "a case name holding U+$cp is exit 2 naming it" "\(U\+$cp at byte 3\)" \
    "$sb" run "$tmp/zw.yaml" --out "$tmp/zw"
done
# A case named '=1+1 reads back as itself (the formula guard's apostrophe is the writer's only).
sed "s/name: lin/name: \"'=1+1\"/" "$tmp/ok.yaml" > "$tmp/apos.yaml"
check "a case named \"'=1+1\" reads back as itself" 0 "^kept$" -- bash -c \
  '"$1" run "$2" --out "$3" >/dev/null && "$1" report "$3" --no-plots >/dev/null &&
   grep -q "Case ok/'"'"'=1+1" "$3/report.md" && echo kept' _ "$sb" "$tmp/apos.yaml" "$tmp/apos"
# Names that differ only by space and underscore, and a 200-byte name: files of their own.
long=$(printf 'n%.0s' $(seq 1 200))
cat > "$tmp/slugs.yaml" <<Y
suite: slugs
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - {name: "a b", workload: linear, shape: {input: [8, 16], out_features: 8}, mesh: 2, strategies: ["sharding/linear/sharded_tensor/colwise"]}
  - {name: "a_b", workload: linear, shape: {input: [8, 16], out_features: 8}, mesh: 2, strategies: ["sharding/linear/sharded_tensor/colwise"]}
  - {name: "$long", workload: linear, shape: {input: [8, 16], out_features: 8}, mesh: 2, strategies: ["sharding/linear/sharded_tensor/colwise"]}
Y
check "cases 'a b', 'a_b' and a 200-byte name: a plot each" 0 "^3 plots$" -- bash -c \
  '"$1" run "$2" --out "$3" >/dev/null && "$1" report "$3" >/dev/null &&
   echo "$(ls "$3"/plots/time_*.png | wc -l) plots"' _ "$sb" "$tmp/slugs.yaml" "$tmp/slugs"
# Silent acceptance: a second YAML document, clip_grad_norm 0, half a launcher's variables.
{ cat "$tmp/ok.yaml"; printf -- '---\nsuite: second\ncases: []\n'; } > "$tmp/twodocs.yaml"
bad "a suite with a second YAML document is exit 2 naming its line" \
  "twodocs.yaml:9: a second YAML document" "$sb" run "$tmp/twodocs.yaml" --out "$tmp/keep"
cat > "$tmp/clip0.yaml" <<'Y'
suite: clip0
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: steps
    workload: mlp
    shape: {batch: 8, d_model: 16, layers: 1}
    mesh: 2
    steps: 2
    optimizer: {kind: sgd, lr: 0.01, clip_grad_norm: 0}
    strategies: ["sharding/fsdp/.*"]
Y
bad "clip_grad_norm: 0 is exit 2 saying what torch would do" \
  "clip_grad_norm' is 0, which torch reads as 'zero every gradient'" \
  "$sb" run "$tmp/clip0.yaml" --out "$tmp/keep"
bad "LOCAL_RANK not below LOCAL_WORLD_SIZE is exit 2 naming both" \
  "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2" \
  env RANK=0 WORLD_SIZE=2 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
bad "SLURM_PROCID without SLURM_NTASKS is exit 2" "SLURM_PROCID=1 is set but SLURM_NTASKS is not" \
  env SLURM_PROCID=1 "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
# solve: two outputs into one file, costs past a double, a model beside a workload.
bad "solve pipeline --out X --trace X is exit 2" "--out and --trace name the same file" \
  "$sb" solve pipeline --stages 2 --microbatches 4 --out "$tmp/same.json" --trace "$tmp/same.json"
python3 -c '
import json
print(json.dumps({"ftime": [1e308, 1e308], "btime": [1e308, 1e308, 0], "x": [1, 1, 1],
                  "xbar": [1, 1, 1], "ftmp": [0, 0], "btmp": [0, 0, 0]}))' \
  > "$tmp/chain308.json"
check "solve pipeline --chain with costs of 1e308: exit 2, never a null step time" 2 \
  "sum past what a double holds|must be|finite" -- \
  "$sb" solve pipeline --stages 2 --microbatches 4 --chain "$tmp/chain308.json"
bad "solve shard --model with --workload is exit 2" "(--model excludes --workload|--workload excludes --model)" \
  "$sb" solve shard --model "$tmp/none.pt" --input '[2, 16]' --workload gpt2 --mesh 2
# A CSV schedule that deadlocks is refused before any rank waits on it.
printf '0F0,0B0\n1B0,1F0\n' > "$tmp/deadlock.csv"
cat > "$tmp/deadlock.yaml" <<Y
suite: deadlock
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: mlp
    workload: mlp_chain
    shape: {batch: 4, width: 16, depth: 2, dropout: 0, microbatches: 1}
    mesh: 2
    params: {csv: $tmp/deadlock.csv}
    strategies: ["pipeline/csv"]
Y
bad "a deadlocking pipeline CSV is exit 2 in seconds, naming the wait" \
  "the schedule cannot finish: rank 1 waits at 1B0" \
  "$sb" run "$tmp/deadlock.yaml" --out "$tmp/keep"

# Model files: a FIFO is refused before anything opens it (it would block), a zip bomb before
# LibTorch inflates it.
mkfifo "$tmp/fifo.pt"
bad "a FIFO as a model file is exit 2 in seconds" "fifo.pt: not a regular file" \
  "$sb" graph --model "$tmp/fifo.pt" --input '[2, 16]'
python3 - "$tmp/bomb.pt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("bomb/version", "3\n")
    info = zipfile.ZipInfo("bomb/data/0")
    info.compress_type = zipfile.ZIP_DEFLATED
    with z.open(info, "w", force_zip64=True) as f:
        block = bytes(1 << 20)
        for _ in range(200):  # 200 MiB of zeros, about 200 KiB deflated
            f.write(block)
PY
bad "a zip bomb as a model file is exit 2 before it is inflated" \
  "record 'bomb/data/0' inflates from [0-9]+ to 209715200 bytes: a zip bomb" \
  "$sb" graph --model "$tmp/bomb.pt" --input '[2, 16]'
# A reference that is not finite is the reference's failure, said on every row, never a
# strategy's "got nan, expected nan".
cat > "$tmp/diverge.yaml" <<'Y'
suite: diverge
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: lr10
    workload: mlp
    shape: {batch: 4, d_model: 8, layers: 1}
    mesh: 2
    steps: 40
    optimizer: {kind: sgd, lr: 10}
    strategies: ["sharding/fsdp/ddp"]
Y
check "a diverging reference errors every row, blaming the reference" 1 "^blamed$" -- bash -c \
  '"$1" run "$2" --out "$3" >/dev/null; python3 -c "
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows and all(r[\"status\"] == \"error\" and \"the reference is not finite\" in r[\"message\"] for r in rows), rows
print(\"blamed\")" "$3/results.csv"; exit 1' _ "$sb" "$tmp/diverge.yaml" "$tmp/diverge"

# Earlier rounds: a profile of another mesh, a step number that is not one.
bad "solve shard --profile measured on another mesh is exit 2" "was measured on mesh 2, not 2x2" \
  "$sb" solve shard --workload mlp --mesh 2x2 --profile "$src/ci/fuzz/corpus/profile/mesh2.json"
check "memory_trace.py --step -5 is exit 2 naming it" 2 "steps count from 1" -- \
  python3 "$src/reports/memory_trace.py" /dev/null --step -5

# A TorchScript file whose parameter is a view past its storage (sizes (200,) on 6 floats,
# written by editing a real file's pickle): refused before anything reads it (LibTorch's
# loader does not check; the first copy would read another object's memory).
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, zipfile, torch
d = sys.argv[1]
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    def forward(self, x):
        return x * self.w
torch.jit.save(torch.jit.trace(M(), torch.ones(2, 6)), d + "/view_ok.pt")
z = zipfile.ZipFile(d + "/view_ok.pt")
pk = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
data = bytearray(z.read(pk))
i = data.index(b"(K\x06t(K\x01t")  # the parameter's sizes (6,) and strides (1,)
data[i + 2] = 200
with zipfile.ZipFile(d + "/view_past.pt", "w", zipfile.ZIP_STORED) as out:
    for n in z.namelist():
        out.writestr(n, bytes(data) if n == pk else z.read(n))
PY
  # (LibTorch 2.x's own loader refuses it first, in its words.)
  bad "a .pt whose parameter runs past its storage is exit 2 naming it" \
    "parameter 'w' \(200, offset 0\) reaches past its storage of 24 bytes|require a storage of at least 800 bytes, but storage only has 24" \
    "$sb" graph --model "$tmp/view_past.pt" --input '[2, 6]'
  check "... and the same file unedited loads" 0 "" -- "$sb" graph --model "$tmp/view_ok.pt" --input '[2, 6]'
else
  fail "no /usr/bin/python3 with torch: the crafted .pt cannot be written"
fi

# A malformed parameter under a strategy pattern is bad input, not hidden behind an
# `unsupported` row (FSDP's "needs steps" came first).
cat > "$tmp/patparam.yaml" <<'Y'
suite: patparam
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: a
    workload: mlp
    shape: {batch: 4, d_model: 8, layers: 1}
    mesh: 2
    params: {reshard_after_forward: "many"}
    strategies: ["sharding/fsdp/.*"]
Y
bad "a malformed params value under a pattern is exit 2 naming it" \
  "params.reshard_after_forward must be true or false, got \"many\"" \
  "$sb" run "$tmp/patparam.yaml" --out "$tmp/keep"

# solve pipeline --csv of a folder or a FIFO: exit 2 saying so (a folder read as "no ranks", a
# FIFO waited for a writer).
mkdir -p "$tmp/csvdir"
mkfifo "$tmp/csv.fifo"
bad "solve pipeline --csv FOLDER is exit 2 saying it is not a file" "csvdir: not a regular file" \
  "$sb" solve pipeline --csv "$tmp/csvdir"
bad "solve pipeline --csv FIFO is exit 2 in seconds" "csv.fifo: not a regular file" \
  "$sb" solve pipeline --csv "$tmp/csv.fifo"

bad "launch --timeout 1e-9 is exit 2 naming the option's range" "--timeout.*1" \
  "$sb" launch -n 2 --timeout 1e-9 -- run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"

# Models that import but whose reference could not run: said as what the model is.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, torch
d = sys.argv[1]
class Dict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        return {"y": self.l(x)}
class Argmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.l(x).argmax(-1)
class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2
torch.jit.save(torch.jit.trace(Dict(), torch.ones(2, 4), strict=False), d + "/odd_dict.pt")
torch.jit.save(torch.jit.trace(Argmax(), torch.ones(2, 4)), d + "/odd_int.pt")
torch.jit.save(torch.jit.trace(Double(), torch.ones(2, 4)), d + "/odd_noparam.pt")
PY
  bad "a model returning a dict is exit 2 saying what it returns" "forward returns Dict\[str, Tensor\]" \
    "$sb" graph --model "$tmp/odd_dict.pt" --input '[2, 4]'
  bad "a model returning an integer tensor is exit 2 saying it has no gradient" \
    "forward returns a tensor of Long, which has no gradient" \
    "$sb" graph --model "$tmp/odd_int.pt" --input '[2, 4]'
  bad "a model without parameters is exit 2 saying so" "the model has no parameters" \
    "$sb" graph --model "$tmp/odd_noparam.pt" --input '[2, 4]'
fi

# Models of other kinds: saved in float64 (imported at its own dtype, run at any case dtype), a
# parameter that reaches no output, weights edited to another shape than the code's, inputs
# bigger than the machine.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, torch
d = sys.argv[1]
class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
torch.jit.save(torch.jit.trace(Mlp().double(), torch.ones(2, 4, dtype=torch.float64)), d + "/f64.pt")
class Ignores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return x + 1
torch.jit.save(torch.jit.trace(Ignores(), torch.ones(2, 4)), d + "/ignores.pt")
m = torch.jit.trace(Mlp(), torch.ones(2, 4))
m.a.weight = torch.nn.Parameter(torch.ones(8, 5))  # the file's weight no longer fits its code
torch.jit.save(m, d + "/edited.pt")
PY
  check "a model saved in float64 imports at its own dtype" 0 "" -- \
    "$sb" graph --model "$tmp/f64.pt" --input '[2, 4]'
  suite f64 <<Y
suite: f64
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: as-float32
    workload: torchscript
    shape: {file: $tmp/f64.pt, inputs: [[4, 4]]}
    mesh: 2
    strategies: ["sharding/auto/(ilp|replicated)"]
  - name: as-float64
    workload: torchscript
    dtype: float64
    shape: {file: $tmp/f64.pt, inputs: [[4, 4]]}
    mesh: 2
    strategies: ["sharding/auto/(ilp|replicated)"]
Y
  check "... and its rows pass at float32 and float64" 0 "total +4 +0 +0 +0 +0" -- \
    "$sb" run "$tmp/f64.yaml" --out "$tmp/f64.run"
  bad "a model whose parameters reach no output is exit 2 naming them" \
    "no trainable parameter of the model reaches its output \(w\)" \
    "$sb" graph --model "$tmp/ignores.pt" --input '[2, 4]'
  bad "weights edited to another shape: exit 2 naming the parameter and the file, not only shapes" \
    "'a.weight' \[8, 5\] Float \(a parameter of the file\).*do not fit its code" \
    "$sb" graph --model "$tmp/edited.pt" --input '[2, 4]'
  bad "inputs bigger than the machine: exit 2 naming the input, before the allocator fails" \
    "inputs\[0\] \[16000000,16000000\] holds .* more than this machine's memory" \
    "$sb" graph --model "$tmp/f64.pt" --input '[16000000, 16000000]'
fi

# Forwards that change what the reference runs on (issue 60, the wrong party blamed): an input
# or a parameter written in place, a buffer written and then read, memory from torch.empty.
# Each failed every strategy's row; now exit 2 naming the node. A buffer written and never
# read (batch norm's counter) imports as before.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY' 2>/dev/null
import sys, torch
d = sys.argv[1]
class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
        self.register_buffer("b", torch.zeros(4))
class InputInPlace(Base):
    def forward(self, x):
        x.add_(1)
        return self.l(x)
class ParamInPlace(Base):
    def forward(self, x):
        with torch.no_grad():
            self.l.weight.mul_(0.5)
        return self.l(x)
class BufferReadAfterWrite(Base):
    def forward(self, x):
        self.b.add_(1)
        return self.l(x) + self.b
class BufferCounter(Base):
    def forward(self, x):
        self.b.add_(1)
        return self.l(x)
class Empty(Base):
    def forward(self, x):
        return self.l(x) + torch.empty(2, 4)
class EmptyFilled(Base):
    def forward(self, x):
        return self.l(x) + torch.empty(2, 4).fill_(0.5)
for m in [InputInPlace, ParamInPlace, BufferReadAfterWrite, BufferCounter, Empty, EmptyFilled]:
    torch.jit.save(torch.jit.trace(m(), torch.ones(2, 4), check_trace=False),
                   d + "/mut_" + m.__name__ + ".pt")
class Two(Base):
    def forward(self, x, y):
        return self.l(x) + self.l(y)
torch.jit.save(torch.jit.trace(Two(), (torch.ones(2, 4), torch.ones(2, 4))), d + "/two.pt")
PY
  # Two inputs of 60% of this machine's memory each: refused together, each alone fits.
  # (Rows of 4096 x 4 float32s, 64 KiB each: every dimension stays under the 2^24 a shape takes.)
  rows=$(awk '/^MemTotal:/ {printf "%d", $2 * 1024 * 0.6 / 65536}' /proc/meminfo)
  bad "inputs that pass the machine's memory only together are exit 2 saying so" \
    "the 2 inputs hold .* GiB together, more than this machine's memory" \
    "$sb" graph --model "$tmp/two.pt" --input "[$rows, 4096, 4]" --input "[$rows, 4096, 4]"
  bad "a forward writing its input in place is exit 2 naming the node" \
    "node aten::add_ .* writes in place into the input 'x'" \
    "$sb" graph --model "$tmp/mut_InputInPlace.pt" --input '[2, 4]'
  bad "a forward writing a parameter in place is exit 2 naming it" \
    "node aten::mul_ .* writes in place into the parameter 'l.weight'" \
    "$sb" graph --model "$tmp/mut_ParamInPlace.pt" --input '[2, 4]'
  bad "a forward reading a buffer it wrote in place is exit 2 naming both nodes" \
    "reads the buffer 'b', which this forward wrote in place before \(.*aten::add_" \
    "$sb" graph --model "$tmp/mut_BufferReadAfterWrite.pt" --input '[2, 4]'
  check "a buffer written and never read (a counter) imports" 0 "" -- \
    "$sb" graph --model "$tmp/mut_BufferCounter.pt" --input '[2, 4]'
  bad "a forward reading torch.empty's memory is exit 2 naming the node" \
    "reads memory that .*aten::empty.* left uninitialised" \
    "$sb" graph --model "$tmp/mut_Empty.pt" --input '[2, 4]'
  check "torch.empty filled before it is read imports" 0 "" -- \
    "$sb" graph --model "$tmp/mut_EmptyFilled.pt" --input '[2, 4]'
fi
suite huge <<'Y'
suite: huge
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: big
    workload: mlp
    shape: {batch: 100000, d_model: 100000, layers: 1}
    mesh: 2
    strategies: ["sharding/auto/replicated"]
Y
check "a built-in workload bigger than the machine: its row names the shape" 1 \
  "the case's workload mlp at shape .*\"batch\":100000.*more memory than this machine gives" -- \
  "$sb" run "$tmp/huge.yaml" --out "$tmp/huge.run"

# A folder or a FIFO where a reader takes a file: refused in seconds, never a wait for a writer
# or an exception from the stream library (an abort).
mkdir -p "$tmp/adir"
[ -p "$tmp/afifo" ] || mkfifo "$tmp/afifo"
for f in adir afifo; do
  bad "solve checkpoint --chain $f is exit 2" "$f: not a regular file" \
    "$sb" solve checkpoint --chain "$tmp/$f" --budget none
  bad "solve shard --profile $f is exit 2" "$f: not a regular file" \
    "$sb" solve shard --workload mlp --mesh 2 --profile "$tmp/$f"
  bad "report --noise $f is exit 2" "$f: not a regular file" \
    "$sb" report "$tmp/keep" --noise "$tmp/$f" --no-plots --out "$tmp/rep-$f"
done

# Nesting past yaml-cpp's guard: said as such (yaml-cpp's own words are "bad file").
python3 -c "print('suite: deep\ncases:\n  - name: a\n    workload: mlp\n    shape: ' + '[' * 3000 + ']' * 3000)" \
  > "$tmp/deep.yaml"
bad "a suite nested thousands deep is exit 2 saying so" "nested over [0-9]+ levels deep" \
  "$sb" run "$tmp/deep.yaml" --out "$tmp/keep"

# Malformed params under a pattern, in every family: each strategy checks its params before it
# says it cannot run the case (checkpointing and chunking on two ranks, a pipeline on one).
for spec in "checkpointing/.*|mlp_chain|{batch: 4, width: 8, depth: 2}|2|{budget: half}|params.budget must be a positive fraction" \
            "chunking/.*|gpt2_prefill|{batch: 1, seq: 16, d_model: 16, heads: 2, layers: 1}|2|{chunk: 0}|params.chunk must be a positive integer" \
            "chunking/.*|gpt2_prefill|{batch: 1, seq: 16, d_model: 16, heads: 2, layers: 1}|1|{chunk: 0x4}|params.chunk must be a positive integer, got \"0x4\"" \
            "chunking/.*|gpt2_prefill|{batch: 1, seq: 16, d_model: 16, heads: 2, layers: 1}|1|{chunk: 17}|params.chunk 17 is longer than the sequence \(16\)" \
            "chunking/triangle/.*|evoformer_pair|{batch: 1, n: 8, c: 4, hidden: 4, layers: 1}|1|{chunk: 9}|params.chunk 9 is longer than the pair's [a-z]+ \(8\)" \
            "pipeline/.*|mlp_chain|{batch: 4, width: 8, depth: 2, dropout: 0}|1|{virtual_stages: 0}|params.virtual_stages must be an integer from 1 to 64" \
            "sharding/moe/.*|moe|{batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 4, top_k: 2}|3|{axes: [ep, ep]}|params.axes"; do
  IFS='|' read -r pattern workload shape mesh params message <<< "$spec"
  suite patfamily <<Y
suite: patfamily
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: a
    workload: $workload
    shape: $shape
    mesh: $mesh
    params: $params
    strategies: ["$pattern"]
Y
  bad "a malformed value under '$pattern' where every row would be unsupported: exit 2" \
    "$message" "$sb" run "$tmp/patfamily.yaml" --out "$tmp/keep"
done

# Third round's leftovers (issue 60).
# Models: frozen parameters are module state (graph inputs, neither differentiated nor trained);
# a model of only frozen ones, an output of no elements and bounds on a floating input are exit 2.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, torch
d = sys.argv[1]
class Frozen(torch.nn.Module):
    def __init__(self, all_frozen=False):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 4)
        for p in (self.parameters() if all_frozen else self.a.parameters()):
            p.requires_grad_(False)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
class Empty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.l(x)[:, :0]
torch.jit.save(torch.jit.trace(Frozen(), torch.ones(2, 4)), d + "/frozen.pt")
torch.jit.save(torch.jit.trace(Frozen(True), torch.ones(2, 4)), d + "/allfrozen.pt")
torch.jit.save(torch.jit.trace(Empty(), torch.ones(2, 4)), d + "/empty.pt")
class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        y = self.l(x)
        return ((y, y * 2), y * 3)
torch.jit.save(torch.jit.trace(Nested(), torch.ones(2, 4), check_trace=False), d + "/nested.pt")
PY
  check "a model returning nested tuples is verified on its first tensor" 0 \
    "2 parameters, output l\.linear" -- "$sb" graph --model "$tmp/nested.pt" --input '[2, 4]'
  check "a frozen parameter is a graph input, not a parameter" 0 "^frozen$" -- bash -c \
    '"$1" graph --model "$2" --input "[2, 4]" --json | python3 -c "
import json, sys
g = json.load(sys.stdin)
params = [p[\"name\"] if isinstance(p, dict) else p[0] for p in g[\"parameters\"]]
inputs = [p[\"name\"] if isinstance(p, dict) else p[0] for p in g[\"inputs\"]]
assert \"a.weight\" not in params and \"b.weight\" in params, params
assert \"a.weight\" in inputs, inputs
print(\"frozen\")"' _ "$sb" "$tmp/frozen.pt"
  suite frozen <<Y
suite: frozen
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: train
    workload: torchscript
    shape: {file: $tmp/frozen.pt, inputs: [[4, 4]]}
    mesh: 2
    steps: 3
    optimizer: {kind: sgd, lr: 0.1}
    strategies: ["sharding/auto/(ilp|replicated)", "sharding/fsdp/ddp"]
Y
  check "... and a training case of it passes, the frozen weights compared untrained" 0 \
    "total +3 +0 +0 +0 +0" -- "$sb" run "$tmp/frozen.yaml" --out "$tmp/frozen.run"
  bad "a model whose every parameter is frozen is exit 2 naming them" \
    "every parameter of the model is frozen \(requires_grad=False: a.weight, a.bias, b.weight, b.bias\)" \
    "$sb" graph --model "$tmp/allfrozen.pt" --input '[2, 4]'
  bad "an output of no elements is exit 2, not a pass comparing nothing" \
    "forward returns a tensor of shape \[2, 0\].*no elements" \
    "$sb" graph --model "$tmp/empty.pt" --input '[2, 4]'
  bad "low and high on a floating input are exit 2, not ignored" \
    "inputs\[0\].low: a floating input has no bounds" \
    "$sb" graph --model "$tmp/frozen.pt" --input '{"shape": [2, 4], "low": 0, "high": 5}'
  bad "graph --model with --workload is exit 2" "(--model excludes --workload|--workload excludes --model)" \
    "$sb" graph --model "$tmp/frozen.pt" --input '[2, 4]' --workload llama
  bad "solve shard --model with --shape is exit 2" "(--model excludes --shape|--shape excludes --model)" \
    "$sb" solve shard --model "$tmp/frozen.pt" --input '[2, 4]' --mesh 2 --shape '{"layers": 1}'
  bad "graph --input without --model is exit 2" "--input requires --model" \
    "$sb" graph --workload mlp --input '[2, 4]'
  ln -sf "$tmp/loop-b.pt" "$tmp/loop-a.pt"; ln -sf "$tmp/loop-a.pt" "$tmp/loop-b.pt"
  bad "a loop of symbolic links as --model is said as one" "loop-a.pt: a loop of symbolic links" \
    "$sb" graph --model "$tmp/loop-a.pt" --input '[2, 4]'
fi

# Whole numbers compared as integers: 2^62 + 511 is past 2^62 though a double reads it as 2^62;
# 1.5 bytes is no number of bytes.
for spec in "sharding/auto/ilp|mlp|{batch: 4, d_model: 8, layers: 1}|2|4611686018427388415|params.max_memory: expected a whole number of bytes from 0 to 2\^62" \
            "chunking/auto|gpt2_prefill|{batch: 1, seq: 16, d_model: 16, heads: 2, layers: 1}|1|1.5|params.max_memory must be a whole number of bytes"; do
  IFS='|' read -r strategy workload shape mesh value message <<< "$spec"
  suite whole <<Y
suite: whole
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: a
    workload: $workload
    shape: $shape
    mesh: $mesh
    params: {max_memory: $value}
    strategies: ["$strategy"]
Y
  bad "$strategy max_memory $value is exit 2" "$message" "$sb" run "$tmp/whole.yaml" --out "$tmp/keep"
done
# A key only a strategy of another kind reads: chunking does not run an mlp_chain, and the
# pipelines beside it do not read `chunk`.
suite otherkind <<'Y'
suite: otherkind
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: a
    workload: mlp_chain
    shape: {batch: 4, width: 8, depth: 2, dropout: 0}
    mesh: 2
    params: {chunk: 0}
    strategies: ["(pipeline|chunking)/.*"]
Y
bad "a key only a strategy that cannot run the case reads is exit 2, saying which and why" \
  "params key 'chunk' is read by none of its strategies that run it .*'chunking/[a-z_/-]+' reads it and cannot run this case" \
  "$sb" run "$tmp/otherkind.yaml" --out "$tmp/keep"

# Result files a run wrote read back whole, and what no run writes refused naming the column.
check "a run at seed 2^64 - 1 reads back in report" 0 "report: 1 rows: 1 pass" -- bash -c \
  '"$1" run "$2" --seed 18446744073709551615 --out "$3/seedmax" >/dev/null &&
   "$1" report "$3/seedmax" --no-plots' _ "$sb" "$tmp/ok.yaml" "$tmp"
for edit in "world_size|0|column 'world_size': '0' is not a number of ranks from 1" \
            "repetitions|-1|column 'repetitions': '-1' is not a count of repetitions" \
            "seed|-1|column 'seed': '-1' is not a seed"; do
  IFS='|' read -r column value message <<< "$edit"
  rm -rf "$tmp/edited" && mkdir -p "$tmp/edited"
  python3 - "$tmp/keep/results.csv" "$tmp/edited/results.csv" "$column" "$value" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rows[0][sys.argv[3]] = sys.argv[4]
w = csv.DictWriter(open(sys.argv[2], "w", newline=""), fieldnames=list(rows[0].keys()))
w.writeheader()
w.writerows(rows)
PY
  bad "report: $column $value is exit 2 naming the column" "results.csv:2: $message" \
    "$sb" report "$tmp/edited/results.csv" --no-plots --out "$tmp/rep-edited"
done
mkfifo "$tmp/fifo-results.csv"
bad "report --baseline FIFO is exit 2 saying what it is" \
  "fifo-results.csv: not a regular file" \
  "$sb" report "$tmp/keep" --baseline "$tmp/fifo-results.csv" --no-plots --out "$tmp/rep-fifo"
python3 - "$tmp/noise-dup.json" <<'PY'
import json, sys
row = {"suite": "ok", "case": "lin", "strategy_id": "sharding/linear/sharded_tensor/colwise",
       "backend": "threads", "band_pct": 5, "spread_pct": 2}
json.dump({"schema_version": 1, "floor_pct": 2, "factor": 3, "git_sha": "x", "host": "h",
           "runs": ["a", "b"], "rows": [row, dict(row, band_pct=50)]}, open(sys.argv[1], "w"))
PY
bad "report --noise with a key given twice is exit 2 naming it" \
  "rows\[1\] repeats suite 'ok' case 'lin'" \
  "$sb" report "$tmp/keep" --noise "$tmp/noise-dup.json" --no-plots --out "$tmp/rep-noise"
rm -rf "$tmp/blank" && mkdir -p "$tmp/blank"
{ cat "$tmp/keep/results.csv"; echo; echo; } > "$tmp/blank/results.csv"
bad "report: blank lines in results.csv are exit 2 said as such" \
  "results.csv:3: a blank line" \
  "$sb" report "$tmp/blank/results.csv" --no-plots --out "$tmp/rep-blank"
# Golden losses that no longer describe the suite: exit 2 before anything runs.
gold gshort gshort.csv plain 0.01 3
"$sb" run "$tmp/gshort.yaml" --write-golden --out "$tmp/gs1" > /dev/null 2>&1
cp "$tmp/gshort.csv" "$tmp/gshort.copy"
gold glink glink.csv plain 0.01 3
ln -sf "$tmp/gshort.csv" "$tmp/glink.csv"
bad "golden: --write-golden through a symbolic link (another suite's file) is exit 2" \
  "glink.csv: a symbolic link \(-> .*gshort.csv\)" \
  "$sb" run "$tmp/glink.yaml" --write-golden --out "$tmp/keep"
cmp -s "$tmp/gshort.csv" "$tmp/gshort.copy" && pass "the linked golden file is as it was" ||
  fail "the linked golden file changed"
sed -i 's/steps: 3/steps: 4/' "$tmp/gshort.yaml"
bad "golden: a file one step short of the suite's case is exit 2 naming both counts" \
  "gshort.csv: case 'plain' has 3 step\(s\) of golden losses; the suite trains it for 4" \
  "$sb" run "$tmp/gshort.yaml" --out "$tmp/keep"
head -c 40 "$tmp/gshort.copy" > "$tmp/gshort.csv"
bad "golden: an unreadable golden file is exit 2 naming the suite that names it" \
  "suite 'gshort' \(.*gshort.yaml, key 'golden'\): .*gshort.csv" \
  "$sb" run "$tmp/gshort.yaml" --out "$tmp/keep"

# The fourth sweep (issue 60): damage, crashes and hangs on the surfaces of the third round.
# noise --out: a FIFO (or a device) is refused before any work, and left as it was; the same run
# given twice is refused (its spread against itself is 0).
"$sb" run "$tmp/ok.yaml" --out "$tmp/keep2" > /dev/null 2>&1
mkfifo "$tmp/noise.fifo"
bad "noise --out a FIFO is exit 2 and the FIFO stays" "noise: --out .*noise.fifo" \
  "$sb" noise "$tmp/keep" "$tmp/keep2" --out "$tmp/noise.fifo"
[ -p "$tmp/noise.fifo" ] && pass "the FIFO is still a FIFO" || fail "noise replaced the FIFO"
bad "noise given one run twice is exit 2" "^stratbench noise: [^ ]*keep is the run .*keep again \(run_id" \
  "$sb" noise "$tmp/keep" "$tmp/keep" --out "$tmp/noise-twice.json"
# A lock file that is a symbolic link is refused, and what it names keeps its bytes.
mkdir -p "$tmp/lockrun" && echo "my thesis" > "$tmp/victim.txt"
ln -s "$tmp/victim.txt" "$tmp/lockrun/.stratbench.lock"
bad "run: a .stratbench.lock that is a symbolic link is exit 2" \
  "lockrun/.stratbench.lock is a symbolic link" "$sb" run "$tmp/ok.yaml" --out "$tmp/lockrun"
[ "$(cat "$tmp/victim.txt")" = "my thesis" ] && pass "the linked file keeps its bytes" ||
  fail "the lock emptied the file its link names"
# A results name that is a folder: exit 2 before the suite runs, not after.
mkdir -p "$tmp/rdir/results.json"
bad "run: results.json a folder is exit 2 before any row" "rdir/results.json is a folder" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/rdir"
[ ! -e "$tmp/rdir/results.partial.csv" ] && pass "run: no row ran into a folder it cannot finish" ||
  fail "run: rows ran before the folder was refused"
# A suite that is a FIFO or a device: exit 2 in seconds, not a wait or a read without end.
mkfifo "$tmp/suite.fifo"
bad "run: a suite that is a FIFO is exit 2" "suite.fifo: not a regular file" \
  "$sb" run "$tmp/suite.fifo" --out "$tmp/keep"
bad "run: /dev/zero as the suite is exit 2" "/dev/zero: not a regular file" \
  "$sb" run /dev/zero --out "$tmp/keep"
# report: a name of the set that is a folder now is refused before the first move; the previous
# set stays whole and no staging folder is left.
cp -r "$tmp/keep" "$tmp/rset"
"$sb" report "$tmp/rset" --no-plots > /dev/null 2>&1
md_before=$(md5sum < "$tmp/rset/report.md")
rm "$tmp/rset/gate.json" && mkdir "$tmp/rset/gate.json"
bad "report: gate.json a folder is exit 2 naming it" "rset/gate.json is a folder" \
  "$sb" report "$tmp/rset" --no-plots
[ "$(md5sum < "$tmp/rset/report.md")" = "$md_before" ] && [ -s "$tmp/rset/summary.csv" ] &&
  ! ls -d "$tmp/rset"/.report.new.* > /dev/null 2>&1 &&
  pass "report: the previous set is whole and no staging folder is left" ||
  fail "report: a half-moved set or a staging folder left"
# run --trace: a link planted at a trace file's name is replaced, not written through; cases whose
# names differ only by '/' and '+' keep their own folders.
"$sb" run "$tmp/ok.yaml" --out "$tmp/tr1" --trace "$tmp/traces" > /dev/null 2>&1
tfile=$(find "$tmp/traces" -name rank0.trace.json | head -1)
if [ -n "$tfile" ]; then
  echo "my notes" > "$tmp/victim2.txt" && ln -sf "$tmp/victim2.txt" "$tfile"
  check "run --trace over a planted link" 0 "" -- \
    "$sb" run "$tmp/ok.yaml" --out "$tmp/tr2" --trace "$tmp/traces"
  [ "$(cat "$tmp/victim2.txt")" = "my notes" ] && [ -f "$tfile" ] && [ ! -L "$tfile" ] &&
    pass "--trace replaced the link, not the file it named" ||
    fail "--trace wrote through a planted link"
else
  fail "run --trace wrote no rank0.trace.json"
fi
suite tcoll <<'Y'
suite: tcoll
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: a/b
    workload: linear
    shape: {input: [8, 16], out_features: 8}
    mesh: 2
    strategies: ["sharding/linear/sharded_tensor/colwise"]
  - name: a+b
    workload: linear
    shape: {input: [8, 16], out_features: 8}
    mesh: 2
    strategies: ["sharding/linear/sharded_tensor/colwise"]
Y
check "run --trace: cases a/b and a+b" 0 "" -- \
  "$sb" run "$tmp/tcoll.yaml" --out "$tmp/tr3" --trace "$tmp/tcoll-traces"
[ "$(find "$tmp/tcoll-traces" -name rank0.trace.json | wc -l)" = 2 ] &&
  pass "--trace: two cases, two folders" || fail "--trace: two cases shared a folder"
# Two suites naming one golden file: the second's --write-golden is refused (it dropped the
# first's cases), and so is reading the first's losses as the second's.
gold gshare1 gshared.csv plain 0.01
gold gshare2 gshared.csv other 0.01
"$sb" run "$tmp/gshare1.yaml" --write-golden --out "$tmp/gsh1" > /dev/null 2>&1
cp "$tmp/gshared.csv" "$tmp/gshared.copy"
bad "golden: another suite's file is not replaced" \
  "gshared.csv holds the golden losses of suite 'gshare1', not of 'gshare2'" \
  "$sb" run "$tmp/gshare2.yaml" --write-golden --out "$tmp/keep"
cmp -s "$tmp/gshared.csv" "$tmp/gshared.copy" && pass "the first suite's golden file is whole" ||
  fail "the first suite's golden file changed"
bad "golden: another suite's file is not read as this one's" \
  "holds the golden losses of suite 'gshare1'" "$sb" run "$tmp/gshare2.yaml" --out "$tmp/keep"
# report --confirm: the baseline given as the rerun is refused (it passed a real regression).
bad "report --confirm with the baseline itself is exit 2" "is a baseline run" \
  "$sb" report "$tmp/keep2" --baseline "$tmp/keep" --confirm "$tmp/keep" --no-plots \
  --out "$tmp/rep-confirm"
# A master address no host can have: exit 2 naming it, not a wait of the whole timeout.
bad "launch --master-addr 'bad host!' is exit 2" "--master-addr 'bad host!': ' ' is in no host" \
  "$sb" launch -n 2 --master-addr 'bad host!' -- run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
bad "MASTER_ADDR='x y' with a world of 2 is exit 2 naming it" "MASTER_ADDR='x y': ' ' is in no host" \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR='x y' MASTER_PORT=29555 \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
# Launcher variables that would wait out the timeout or be read as something else.
# (Where this host's resolver answers at all: one that does not, EAI_AGAIN, is left to the
# store's retries, so there is nothing to check.)
if getent hosts nonexistent.invalid > /dev/null; [ $? = 2 ]; then
  bad "a master host no resolver knows is exit 2, not a wait" "nonexistent.invalid.*does not resolve" \
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=nonexistent.invalid MASTER_PORT=29556 \
    "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep" --timeout 30
  bad "launch --master-addr no resolver knows is exit 2" "nonexistent.invalid.*does not resolve" \
    "$sb" launch -n 2 --master-addr nonexistent.invalid -- run "$tmp/ok.yaml" --backend gloo \
    --out "$tmp/keep"
else
  pass "a master host no resolver knows: this host's resolver gives no answer (skipped)"
fi
bad "WORLD_SIZE past the largest mesh is exit 2" "WORLD_SIZE='1000000': expected at most 65536" \
  env RANK=1 WORLD_SIZE=1000000 MASTER_ADDR=127.0.0.1 MASTER_PORT=29557 \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
bad "an empty MASTER_PORT is exit 2, not port 29500" "MASTER_PORT is set but empty" \
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT= \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
bad "a Slurm node range that runs backwards is exit 2" "node\[5-1\].*runs backwards" \
  env SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=7 SLURM_STEP_NODELIST='node[5-1]' \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
bad "--backend threads under a launcher's variables is exit 2" \
  "WORLD_SIZE=2 says this process is one of 2 started together, but --backend threads" \
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  "$sb" run "$tmp/ok.yaml" --backend threads --out "$tmp/keep"
bad "--backend threads (the default) under srun's variables is exit 2" \
  "SLURM_STEP_NUM_TASKS=4 says this process is one of 4" \
  env SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 "$sb" run "$tmp/ok.yaml" --out "$tmp/keep"
check "--backend threads in an sbatch script's own shell (no srun step) runs" 0 "" -- \
  env SLURM_PROCID=0 SLURM_NTASKS=4 "$sb" run "$tmp/ok.yaml" --out "$tmp/sbatch-shell"
# --backend gloo there waited as rank 0 of SLURM_NTASKS for ranks nobody starts (the store's
# whole timeout): exit 2 at once, saying to start the ranks with srun.
bad "--backend gloo in an sbatch script's own shell is exit 2, not rank 0 waiting for 4" \
  "SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_ID and SLURM_STEP_NUM_TASKS are not" \
  env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_JOB_ID=7 SLURM_JOB_NODELIST=localhost \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
# memory_trace.py / memory_snapshot.py on a device or a FIFO: exit 2 at once.
bad "memory_trace.py /dev/zero is exit 2" "not a regular file" \
  python3 "$src/reports/memory_trace.py" /dev/zero
bad "memory_snapshot.py into a FIFO is exit 2" "noise.fifo: not a regular file" \
  python3 "$src/reports/memory_snapshot.py" "$tmp/victim.txt" "$tmp/noise.fifo"
# Model files: a record shorter than the storage the pickle gives it (a truncated or edited
# file: LibTorch read past the heap block, a SIGSEGV), and a zip directory past 64 MiB, which
# hid a bomb from the inflation check.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY'
import sys, zipfile, torch, struct
d = sys.argv[1]
torch.jit.save(torch.jit.trace(torch.nn.Linear(256, 256), torch.ones(2, 256)), d + "/big.pt")
with zipfile.ZipFile(d + "/big.pt") as src, zipfile.ZipFile(d + "/short.pt", "w") as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename.endswith("/data/0"):
            data = data[:8]
        dst.writestr(info, data)
# A zip whose end record claims a 100 MiB directory.
with open(d + "/big.pt", "rb") as f:
    b = bytearray(f.read())
at = b.rfind(b"PK\x05\x06")
b[at + 12:at + 16] = struct.pack("<I", 100 << 20)
b[at + 16:at + 20] = struct.pack("<I", 0)
open(d + "/bigdir.pt", "wb").write(bytes(b))
PY
  bad "a model whose record is shorter than its storage is exit 2 naming it" \
    "has a storage of [0-9]+ bytes, but its record in the file holds 8" \
    "$sb" graph --model "$tmp/short.pt" --input '[2, 256]'
  bad "a model whose zip directory is past 64 MiB is exit 2" \
    "its zip directory is 104857600 bytes, over the 64 MiB" \
    "$sb" graph --model "$tmp/bigdir.pt" --input '[2, 256]'
else
  echo "SKIP: no PyTorch in /usr/bin/python3 to make the model files"
fi

# The fifth sweep (issue 60): what a run's results, a traced model's memory and the command line
# let through.
"$sb" run "$tmp/ok.yaml" --out "$tmp/run5" > /dev/null 2>&1
cp "$tmp/run5/results.csv" "$tmp/run5.csv.copy"
check "noise --out a run's results.csv is exit 2, the run kept" 2 "holds a run's results" -- \
  "$sb" noise "$tmp/keep" "$tmp/run5" --out "$tmp/run5/results.csv"
cmp -s "$tmp/run5/results.csv" "$tmp/run5.csv.copy" && pass "... and the run's results.csv is whole" ||
  fail "noise replaced a run's results.csv"
bad "solve shard --out a run's results.json is exit 2" "holds a run's results" \
  "$sb" solve shard --workload mlp --mesh 2 --out "$tmp/run5/results.json"
bad "report given a results.json is exit 2 saying to give the folder" \
  "a JSON file; give the run's folder or its results.csv" \
  "$sb" report "$tmp/keep/results.json" --no-plots --out "$tmp/rep-json"
bad "--plant-fault twice for one strategy is exit 2 saying so" "has a planted fault already" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" \
  --plant-fault 'sharding/linear/sharded_tensor/colwise=consistent_wrong_layout' \
  --plant-fault 'sharding/linear/sharded_tensor/colwise=consistent_wrong_layout'
bad "--plant-slowdown twice for one strategy is exit 2" "has a planted slowdown already" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" \
  --plant-slowdown 'sharding/linear/sharded_tensor/colwise=50' \
  --plant-slowdown 'sharding/linear/sharded_tensor/colwise=10'
: > "$tmp/afile"
bad "run --trace naming a regular file is exit 2 before any row" "--trace '.*afile': not a folder" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --trace "$tmp/afile"
bad "launch --hosts beside --nnodes is exit 2" "--hosts excludes --nnodes|--nnodes excludes --hosts" \
  "$sb" launch -n 2 --hosts 127.0.0.1 --nnodes 2 -- run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
python3 -c '
import json
print(json.dumps({"ftime": [1e308, 1e308], "btime": [1e308, 1, 1], "x": [1, 1, 1],
                  "xbar": [1, 1, 1], "ftmp": [0, 0], "btmp": [0, 0, 0]}))' > "$tmp/chain-huge.json"
bad "solve checkpoint with times that sum past a double is exit 2 saying so" \
  "the times sum past what a double holds" \
  "$sb" solve checkpoint --chain "$tmp/chain-huge.json" --budget 10
sed 's/repetitions: 1/repetitions: "1"/' "$tmp/ok.yaml" > "$tmp/quoted.yaml"
bad "a quoted number in a suite is exit 2, not the number" "not the quoted text '1'" \
  "$sb" run "$tmp/quoted.yaml" --out "$tmp/keep"
rm -rf "$tmp/edited" && cp -r "$tmp/keep" "$tmp/edited" && rm "$tmp/edited/results.json"
edit_first_row "$tmp/edited/results.csv" 'r["backend"] = "foo"'
bad "report on a results.csv with backend 'foo' is exit 2 naming the column" \
  "column 'backend': 'foo' is not one of threads, gloo, nccl" \
  "$sb" report "$tmp/edited" --out "$tmp/edited/rep" --no-plots
# Traced models whose memory the graph cannot follow (an in-place op on a view of an
# intermediate, a setitem into one), tied parameters, a parameter reached only through detach().
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 - "$tmp" <<'PY' 2>/dev/null
import sys, torch
d = sys.argv[1]
class ViewInplace(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.l = torch.nn.Linear(8, 4)
    def forward(s, x):
        y = s.l(x)
        v = y[:, :2]
        v.mul_(2)
        return y
class SetItem(ViewInplace):
    def forward(s, x):
        y = s.l(x) * 1
        y[:, 0] = x[:, 0]
        return y
class Tied(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.a = torch.nn.Linear(8, 8)
        s.b = torch.nn.Linear(8, 8)
        s.b.weight = s.a.weight
    def forward(s, x):
        return s.b(s.a(x))
class Detached(ViewInplace):
    def forward(s, x):
        return s.l(x).detach() * 1.0 + s.l.bias
for m in [ViewInplace, SetItem, Tied, Detached]:
    torch.jit.save(torch.jit.trace(m(), torch.ones(4, 8), check_trace=False),
                   d + "/m5_" + m.__name__ + ".pt")
PY
  bad "an in-place op on a view of an intermediate is exit 2 naming the node" \
    "the forward's result reads '.*', whose memory node aten::mul_ .* wrote in place after it" \
    "$sb" graph --model "$tmp/m5_ViewInplace.pt" --input '[4, 8]'
  bad "a setitem into an intermediate is exit 2 naming the node" \
    "reads '.*', whose memory node aten::copy_ .* wrote in place" \
    "$sb" graph --model "$tmp/m5_SetItem.pt" --input '[4, 8]'
  for m in Tied Detached; do
    cat > "$tmp/m5_$m.yaml" <<Y
suite: m5
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: $m
    workload: torchscript
    shape: {file: $tmp/m5_$m.pt, inputs: [[4, 8]]}
    mesh: 2
    strategies: ["sharding/auto/(replicated|data-parallel)"]
Y
  done
  check "tied parameters: the reference trains the tensor under both names, the plans pass" 0 \
    "total +2 +0 +0 +0 +0" -- "$sb" run "$tmp/m5_Tied.yaml" --out "$tmp/m5-tied"
  check "a parameter reached only through detach(): every row says the model's backward gives it no gradient" \
    1 "PyTorch's backward gives no gradient to l.weight" -- \
    "$sb" run "$tmp/m5_Detached.yaml" --out "$tmp/m5-detached"
fi

# The sixth sweep (issue 60): terminal escapes and text-direction overrides from a results.csv
# edited apart from its run, a pipeline timeline the plot cannot draw, a world of one whose
# master no resolver knows.
for edit in esc_message osc8_git_sha rlo_case; do
  rm -rf "$tmp/ctl" && cp -r "$tmp/keep" "$tmp/ctl" && rm "$tmp/ctl/results.json"
  case $edit in
    esc_message) edit_first_row "$tmp/ctl/results.csv" 'r["message"] = "line1 \x1b[31mRED \x1b[2J"' ;;
    osc8_git_sha)
      edit_first_row "$tmp/ctl/results.csv" 'r["git_sha"] = "\x1b]8;;http://evil\x07link\x1b]8;;\x07"' ;;
    rlo_case) edit_first_row "$tmp/ctl/results.csv" 'r["case"] = "a\u202eb"' ;;
  esac
  check "report on a results.csv with $edit: exit 2 naming the column, nothing written" 2 \
    "column '(message|git_sha|case)' holds (the control character 0x1b|a text-direction)" -- \
    "$sb" report "$tmp/ctl" --out "$tmp/ctl/rep" --no-plots
done
cat > "$tmp/pp.yaml" <<'Y'
suite: pp
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: two
    workload: mlp_chain
    shape: {batch: 8, width: 8, depth: 4, dropout: 0, microbatches: 2}
    mesh: 2
    strategies: ["pipeline/gpipe"]
Y
if "$sb" run "$tmp/pp.yaml" --out "$tmp/pp" > /dev/null 2>&1; then
  # A measured timeline of 100,000 actions a rank (the reader takes a million): drawn, as a
  # collection of bars per rank and type, within the deadline (one bar an action took minutes).
  cp -r "$tmp/pp" "$tmp/ppbig"
  cp -r "$tmp/pp" "$tmp/ppsrc"  # for round 8's timelines, below
  python3 - "$tmp/ppbig/results.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    run = r["details"]["executor"]["pipeline"]["measured"]["run"]
    span, steps = run["step_time_us"], 1
    for rank in run["per_rank"]:
        one = rank["actions"]
        steps = max(steps, 100000 // len(one) + 1)
        rank["actions"] = [dict(a, start_us=a["start_us"] + k * span, end_us=a["end_us"] + k * span)
                           for k in range(100000 // len(one) + 1) for a in one][:100000]
    run["step_time_us"] = span * steps
json.dump(d, open(sys.argv[1], "w"))
PY
  check "report on a 100,000-action timeline a rank: its plot drawn within 240 s" 0 "^drawn$" -- \
    bash -c 'timeout 240 "$1" report "$2" --out "$2/rep" > "$2/rep.log" 2>&1 &&
      ls "$2"/rep/plots/pipeline_*.png > /dev/null && echo drawn' _ "$sb" "$tmp/ppbig"
  python3 - "$tmp/pp/results.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    run = r["details"]["executor"]["pipeline"]["measured"]["run"]
    run["per_rank"][0]["actions"][0]["action"] = "0S0"
json.dump(d, open(sys.argv[1], "w"))
PY
  check "report on a pipeline action no schedule has: the plot skipped naming it, no traceback" 0 \
    "^clean$" -- bash -c '"$1" report "$2" --out "$2/rep" > "$2/rep.log" 2>&1 &&
      grep -q "pipeline action .0S0. is not STAGE" "$2/rep.log" &&
      ! grep -q Traceback "$2/rep.log" && echo clean' _ "$sb" "$tmp/pp"
else
  fail "the pipeline suite for the timeline check did not run"
fi
if getent hosts nonexistent.invalid > /dev/null; [ $? = 2 ]; then
  bad "a world of one on gloo whose master no resolver knows is exit 2, not a wait" \
    "nonexistent.invalid.*does not resolve" \
    env RANK=0 WORLD_SIZE=1 MASTER_ADDR=nonexistent.invalid \
    "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/keep"
fi

# A float16 case on the CPU: where this LibTorch has no float16 matrix product there (1.13),
# exit 2 naming the case, its line and the dtype before anything runs (every row errored
# "reference failed" before); where it has one (2.x), the rows run and none blames the reference.
sed 's/^defaults: {/defaults: {dtype: float16, /' "$tmp/ok.yaml" > "$tmp/half.yaml"
"$sb" run "$tmp/half.yaml" --out "$tmp/half" > "$tmp/half.log" 2>&1
rc=$?
if [ "$rc" = 2 ]; then
  grep -qE "half.yaml:[0-9]+: case 'lin': dtype float16: this LibTorch \(.*\) has no float16 matrix product on the CPU" \
    "$tmp/half.log" && [ ! -e "$tmp/half/results.csv" ] &&
    pass "float16 on a CPU without float16 matrix products: exit 2 naming case, line and dtype" ||
    { cp "$tmp/half.log" "$tmp/out"; fail "float16 on the CPU: exit 2 without the case and dtype"; }
elif [ "$rc" -le 1 ] && [ -s "$tmp/half/results.csv" ] && ! grep -q "reference failed" "$tmp/half/results.csv"; then
  pass "float16 on a CPU with float16 matrix products: the rows run (exit $rc)"
else
  cp "$tmp/half.log" "$tmp/out"; fail "float16 on the CPU: exit $rc"
fi

# A master port where another program accepts and never answers: the rank that connects ends
# within --timeout naming the store (it waited forever in TCPStore's first read).
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True); time.sleep(90)' > "$tmp/silent.port" &
silent=$!
for _ in $(seq 100); do [ -s "$tmp/silent.port" ] && break; sleep 0.1; done
check "a master port that accepts and never answers: the rank ends within --timeout, naming it" 1 \
  "cannot reach the store at 127.0.0.1:[0-9]+: no store answered within 5 s" -- \
  timeout 60 env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(cat "$tmp/silent.port")" \
  "$sb" run "$tmp/ok.yaml" --backend gloo --out "$tmp/silent" --timeout 5
kill "$silent" 2>/dev/null


# Round 8 (the sweep of 2026-12-03). Damage: a result file never replaces what the command reads
# (`solve pipeline --csv S --out S` replaced the schedule by its run; a link to it the same).
"$sb" solve pipeline --stages 2 --microbatches 4 --write-csv "$tmp/own.csv" > /dev/null 2>&1
cp "$tmp/own.csv" "$tmp/own.keep" && ln -sf own.csv "$tmp/own-link.csv"
for out in --out --trace --write-csv; do
  check "solve pipeline --csv S $out S: exit 2, the schedule kept" 2 \
    "own.csv is the file --csv names" -- "$sb" solve pipeline --csv "$tmp/own-link.csv" $out "$tmp/own.csv"
  cmp -s "$tmp/own.csv" "$tmp/own.keep" || fail "solve pipeline $out replaced its own --csv"
done
cp "$src/ci/fuzz/corpus/chain/small.json" "$tmp/own-chain.json"
check "solve pipeline --chain C --trace C: exit 2, the chain kept" 2 "is the file --chain names" -- \
  "$sb" solve pipeline --stages 2 --microbatches 4 --chain "$tmp/own-chain.json" --trace "$tmp/own-chain.json"
cmp -s "$tmp/own-chain.json" "$src/ci/fuzz/corpus/chain/small.json" || fail "--trace replaced --chain"
# memory_snapshot.py into its own trace or a run's results: exit 2, both kept.
printf 'mem reset at 0\nmem +8 -> 8 @0x1\nmem end of the measured step at 8, peak 8\n' > "$tmp/tiny.trace"
cp "$tmp/tiny.trace" "$tmp/tiny.keep"
bad "memory_snapshot.py into the trace it reads is exit 2" "is the file the trace names" \
  python3 "$src/reports/memory_snapshot.py" "$tmp/tiny.trace" "$tmp/tiny.trace"
cmp -s "$tmp/tiny.trace" "$tmp/tiny.keep" || fail "memory_snapshot.py replaced its own trace"
bad "memory_snapshot.py into a run's results.csv is exit 2" "is named as a run's results.csv" \
  python3 "$src/reports/memory_snapshot.py" "$tmp/tiny.trace" "$tmp/keep/results.csv"
# The trace scripts on numbers no tracker writes and result files that are not a run's: exit 2
# naming the file and line or column (tracebacks before).
{ printf 'mem reset at 0\nmem +'; printf '9%.0s' $(seq 5000); printf ' -> 5 @0x1\n'; } > "$tmp/bigint.trace"
for script in memory_trace.py memory_snapshot.py; do
  out=()
  [ "$script" = memory_snapshot.py ] && out=("$tmp/snap.pickle")
  bad "$script on a 5,000-digit byte count is exit 2 naming the line" \
    "bigint.trace:2: not an allocation or free line as the tracker writes it" \
    python3 "$src/reports/$script" "$tmp/bigint.trace" "${out[@]}"
done
printf 'case,x\n\xff,1\n' > "$tmp/latin.csv"
printf 'peak_mem_bytes,x\n5,1\n' > "$tmp/nocase.csv"
bad "memory_trace.py --results that is not UTF-8 is exit 2" "latin.csv: not the results.csv a run writes" \
  python3 "$src/reports/memory_trace.py" "$tmp/tiny.trace" --results "$tmp/latin.csv"
bad "memory_trace.py --results without a case column is exit 2" "nocase.csv: no column 'case'" \
  python3 "$src/reports/memory_trace.py" "$tmp/tiny.trace" --results "$tmp/nocase.csv"
# `run --trace DIR` where DIR/<suite> is a link to another folder: nothing written through it.
mkdir -p "$tmp/tr/traces" "$tmp/tr/elsewhere" && ln -s "$tmp/tr/elsewhere" "$tmp/tr/traces/ok"
# Refused before any row runs (it went on without the traces, exit 0), no results written.
check "run --trace DIR with DIR/<suite> a link: exit 2 before any row, naming the link" 2 \
  "--trace: .*traces/ok is a symbolic link: the traces are written only into folders under --trace" -- \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/tr/out" --trace "$tmp/tr/traces"
[ ! -e "$tmp/tr/out/results.csv" ] && pass "no results of a refused --trace run" ||
  fail "run --trace with a linked level wrote results before refusing"
# A level that is a file (DIR/<suite>/<case> made a file): exit 2 naming it.
mkdir -p "$tmp/tr/traces2/ok" && : > "$tmp/tr/traces2/ok/lin"
check "run --trace DIR with a file at a case's level: exit 2 naming it" 2 \
  "--trace: .*traces2/ok/lin is there and is not a folder" -- \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/tr/out2" --trace "$tmp/tr/traces2"
[ -z "$(ls -A "$tmp/tr/elsewhere")" ] && pass "nothing written through the link" ||
  fail "run --trace wrote through a link: $(ls "$tmp/tr/elsewhere")"

# Names: Unicode's default-ignorables (a tag, a variation selector, a Hangul filler, the braille
# blank) and a blank name read as another name; refused as the zero-width space is.
for c in "li\U000E0001n|U+E0001" "li\uFE00n|U+FE00" "\u3164|U+3164" "a\u2800b|U+2800"; do
  name=${c%|*}
  printf 'suite: hidden\ndefaults: {repetitions: 1, min_time_s: 0.0001}\ncases:\n  - name: "%s"\n    workload: linear\n    shape: {input: [8, 16], out_features: 8}\n    mesh: 2\n    strategies: ["sharding/linear/sharded_tensor/colwise"]\n' \
    "$name" > "$tmp/hidden.yaml"
  code=${c#*|}
  bad "a case name holding $code is exit 2 naming it" "invisible or text-direction characters \(U\+${code#U+} at byte" \
    "$sb" run "$tmp/hidden.yaml" --out "$tmp/keep"
done
sed "s/name: lin/name: ' '/" "$tmp/ok.yaml" > "$tmp/blank.yaml"
bad "a blank case name is exit 2" "key 'name' must not be blank" "$sb" run "$tmp/blank.yaml" --out "$tmp/keep"
sed 's/name: lin/name: "\\u3000\\u00a0"/' "$tmp/ok.yaml" > "$tmp/blank2.yaml"
bad "a case name of Unicode spaces is exit 2" "key 'name' must not be blank" "$sb" run "$tmp/blank2.yaml" --out "$tmp/keep"
# golden: a NUL cut the name short (another file written), escapes reached the terminal and the
# file system; a missing file said not why.
gold gnul '"x\0y.csv"' plain 0.01
gold gesc '"\e]0;t\a.csv"' plain 0.01
bad "golden: a NUL in the name is exit 2, nothing written" "key 'golden' must not hold control characters" \
  "$sb" run "$tmp/gnul.yaml" --write-golden --out "$tmp/gn"
[ ! -e "$tmp/x" ] || fail "golden: the name cut at its NUL was written"
bad "golden: an escape in the name is exit 2" "key 'golden' must not hold control characters" \
  "$sb" run "$tmp/gesc.yaml" --write-golden --out "$tmp/gn"
gold gmiss gmiss.csv plain 0.01
check "golden: a file not written yet says so and what writes it" 2 \
  "gmiss.csv: cannot read the golden losses file \(No such file or directory\): .stratbench run SUITE --write-golden. writes it" -- \
  "$sb" run "$tmp/gmiss.yaml" --out "$tmp/gn"
# Pipeline timelines no run writes (an action ending before it starts, a rank twice, micro-batch
# 9 of 2, 0 micro-batches) are named and not drawn; 5,000 ranks are drawn (the first 64) at once.
if [ -d "$tmp/ppsrc" ]; then
  for k in rev rankdup micro mb0 many; do
    rm -rf "$tmp/pp-$k" && cp -r "$tmp/ppsrc" "$tmp/pp-$k"
    python3 - "$tmp/pp-$k/results.json" "$k" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); k = sys.argv[2]
run = d["records"][0]["details"]["executor"]["pipeline"]["measured"]["run"]
a0 = run["per_rank"][0]["actions"][0]
if k == "rev": a0["start_us"], a0["end_us"] = 100.0, 1.0
if k == "rankdup": run["per_rank"][1]["rank"] = 0
if k == "micro": a0["action"] = a0["action"][:-1] + "9"
if k == "mb0": run["microbatches"] = 0
if k == "many": run["per_rank"] = [dict(run["per_rank"][0], rank=i) for i in range(5000)]; run["ranks"] = 5000
json.dump(d, open(sys.argv[1], "w"))
PY
  done
  for c in "rev|from 100.0 to 1.0 us: no run writes that" "rankdup|rank 0 \(ranks 0 to 1, each once\)" \
           "micro|micro-batches 0 to 1\)" "mb0|2 stages, 0 micro-batches"; do
    k=${c%%|*}
    check "report on a pipeline timeline no run writes ($k): named, not drawn" 0 "^named$" -- \
      bash -c 'timeout 60 "$1" report "$2" --out "$2/rep" > "$2/rep.log" 2>&1 &&
        grep -qE "pipeline run: .*$3" "$2/rep.log" && ! ls "$2"/rep/plots/pipeline_*.png 2>/dev/null &&
        grep -q "Plots are missing: .*timelines not drawn: " "$2/rep/report.md" &&
        echo named' _ "$sb" "$tmp/pp-$k" "${c#*|}"
  done
  check "report on a timeline of 5,000 ranks: drawn (the first 64) within 60 s" 0 "^drawn$" -- \
    bash -c 'timeout 60 "$1" report "$2" --out "$2/rep" > "$2/rep.log" 2>&1 &&
      ls "$2"/rep/plots/pipeline_*.png > /dev/null && echo drawn' _ "$sb" "$tmp/pp-many"
fi

# STRATBENCH_PYTHON naming no interpreter: said as that variable's value (the message suggested
# setting it); the report is written, its plots missing.
check "report with STRATBENCH_PYTHON=/nonexistent names the variable" 0 \
  "cannot start STRATBENCH_PYTHON='/nonexistent'" -- \
  env STRATBENCH_PYTHON=/nonexistent "$sb" report "$tmp/keep" --out "$tmp/rep-nopy"

# Silent acceptance: two cost profiles of one backend and mesh (one was used without a word); a
# profile replaced by the plan it priced.
prof="$src/ci/fuzz/corpus/profile/mesh2.json"
cp "$prof" "$tmp/prof-a.json" && cp "$prof" "$tmp/prof-b.json"
bad "two --cost-profile of one backend and mesh are exit 2 naming both" \
  "--cost-profile .*prof-a.json and .*prof-b.json are both measured on backend" \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/keep" --cost-profile "$tmp/prof-a.json" --cost-profile "$tmp/prof-b.json"
check "solve shard --profile P --out P: exit 2, the profile kept" 2 "is the file --profile names" -- \
  "$sb" solve shard --workload mlp --mesh 2 --profile "$tmp/prof-a.json" --out "$tmp/prof-a.json"
cmp -s "$tmp/prof-a.json" "$prof" || fail "solve shard --out replaced its --profile"
# Options that say nothing (an unset variable): refused, not read as "everything".
for c in "run|--filter" "run|--case" "list|--filter" "solve shard|--sac-policy"; do
  cmd=${c%|*} opt=${c#*|}
  args=()
  case $cmd in
    run) args=("$tmp/ok.yaml" --out "$tmp/keep") ;;
    "solve shard") args=(--workload mlp --mesh 2) ;;
  esac
  # shellcheck disable=SC2086
  bad "$cmd $opt '' is exit 2" "$opt: expected .*got an empty string" "$sb" $cmd "${args[@]}" "$opt" ""
done
bad "launch --hosts '' is exit 2" "--hosts: expected hosts, node 0 first, got an empty string" \
  "$sb" launch -n 2 --hosts "" -- run "$tmp/ok.yaml" --out "$tmp/keep"
bad "solve parallel --verify-out without --verify is exit 2" "--verify-out .* without --verify K" \
  "$sb" solve parallel --workload llama --ranks 2 --verify-out "$tmp/vo"
# noise over runs of two backends: said so (it said no row passed in two runs).
rm -rf "$tmp/keep-gloo" && mkdir -p "$tmp/keep-gloo" && cp "$tmp/keep2/results.csv" "$tmp/keep-gloo/"
edit_first_row "$tmp/keep-gloo/results.csv" 'r["backend"] = "gloo"; r["run_id"] = "gloo-run"'
bad "noise over a threads run and a gloo run is exit 2 saying the backends differ" \
  "keep2? ran on threads, .*keep-gloo on gloo: the spread is measured on one backend" \
  "$sb" noise "$tmp/keep2" "$tmp/keep-gloo" --out "$tmp/noise-backends.json"

# Unbounded: a message quoting what it refuses (a --shape nested 60,000 deep printed 120 KB, a
# redistribute --shape 240 KB) keeps its head and tail, at most a few KiB.
deep=$(python3 -c "print('[' * 60000 + ']' * 60000)")
for c in "graph --workload gpt2 --shape" "solve redistribute --mesh 2 --from R --to S0 --shape"; do
  # shellcheck disable=SC2086
  check "$c nested 60,000 deep: exit 2, the message under 8 KiB" 0 "^short$" -- bash -c \
    '"$1" $2 "$3" > "$4/deep.out" 2>&1; [ $? = 2 ] && [ "$(wc -c < "$4/deep.out")" -lt 8192 ] &&
     echo short' _ "$sb" "$c" "$deep" "$tmp"
done

# launch starts the ranks of run or calibrate: another launch under it (a world of worlds) or a
# report (one per rank into one folder) is exit 2 before any process starts.
for inner in "launch -n 2 -- run $tmp/ok.yaml" "report $tmp/keep"; do
  # shellcheck disable=SC2086
  bad "launch -- ${inner%% *} is exit 2" "\`${inner%% *}\` is not a command whose processes form a world" \
    "$sb" launch -n 2 -- $inner
done

# The second sweep of round 8. Unbounded: a chain of 10^8 layers passed the element bound and
# grew gigabytes before a row ran; exit 2 naming the key, as the graph workloads' 1024.
sed -e 's/workload: linear/workload: mlp_chain/' \
    -e 's/shape: {input: \[8, 16\], out_features: 8}/shape: {batch: 2, width: 8, depth: 100000000}/' \
    "$tmp/ok.yaml" > "$tmp/deepchain.yaml"
bad "an mlp_chain of 10^8 layers is exit 2 naming depth" "shape key 'depth' must be at most 1024" \
  "$sb" run "$tmp/deepchain.yaml" --out "$tmp/keep"
bad "solve chunk of 10^8 layers is exit 2 naming layers" "shape key 'layers' must be at most 1024" \
  "$sb" solve chunk --workload gpt2_prefill --shape '{"layers": 100000000}' --max-memory 1e9
# Hang: a FIFO given as a plugin blocked dlopen forever.
mkfifo "$tmp/plugin.so"
bad "a FIFO as --plugin is exit 2 at once" "plugin '.*plugin.so': not a regular file" \
  "$sb" list --plugin "$tmp/plugin.so"
# The run judged given as its own baseline passed the gate whatever it held.
bad "report RUN --baseline RUN is exit 2" "--baseline .*keep is the results being judged" \
  "$sb" report "$tmp/keep" --baseline "$tmp/keep" --gate --no-plots --out "$tmp/selfbase"
# STRATBENCH_GIT_SHA is written into every row: an ESC or a newline made report refuse the run's
# own file; run refuses it, naming it, before any row.
bad "STRATBENCH_GIT_SHA with an ESC is exit 2 naming it" "STRATBENCH_GIT_SHA holds the control character 0x1b" \
  env STRATBENCH_GIT_SHA="$(printf 'abc\033[31m')" "$sb" run "$tmp/ok.yaml" --out "$tmp/keep"
# A report into a folder no report wrote does not replace the user's files of its names.
mkdir -p "$tmp/proj" && echo "# my notes" > "$tmp/proj/report.md"
check "report --out a folder of the user's with a report.md: exit 2, the notes kept" 2 \
  "report.md is there and no report wrote it" -- "$sb" report "$tmp/keep" --out "$tmp/proj" --no-plots
[ "$(cat "$tmp/proj/report.md")" = "# my notes" ] || fail "report replaced the user's report.md"
# A direction override quoted from the input is shown escaped, never printed raw.
sed -e '$a\    params: {cut: "\\u202eevil.yaml"}' "$tmp/pp.yaml" > "$tmp/bidi.yaml"  # pp's case
check "a params value with U+202E: exit 2, the override escaped in the message" 0 "^escaped$" -- bash -c \
  '"$1" run "$2" --out "$3/bidi" > "$3/bidi.log" 2>&1; [ $? = 2 ] && grep -q "u202e" "$3/bidi.log" &&
   ! grep -q "$(printf "\342\200\256")" "$3/bidi.log" && echo escaped' _ "$sb" "$tmp/bidi.yaml" "$tmp"
bad "calibrate --max-bytes past the 4 MiB it measures is exit 2" "from 4096 to 4194304" \
  "$sb" calibrate --mesh 2 --max-bytes 1073741824 --out "$tmp/cal.json"

# Round 9 (2026-12-03, fourth session): what round 8 left open.
# SB_MEMORY_TRACE naming a rank no row has traced nothing without a word; past the tracker's 64
# ranks it traced the unattributed bucket (every rank's allocations outside a rank scope).
check "SB_MEMORY_TRACE=5 on meshes of 2: the run says nothing was traced" 0 \
  "SB_MEMORY_TRACE=5 traced nothing: no row of this run ran a rank 5" -- \
  env SB_MEMORY_TRACE=5 "$sb" run "$tmp/ok.yaml" --out "$tmp/trace5"
check "SB_MEMORY_TRACE=64 is refused as past the tracker's ranks" 0 \
  "SB_MEMORY_TRACE='64' is past the 64 ranks the memory tracker counts" -- \
  env SB_MEMORY_TRACE=64 "$sb" run "$tmp/ok.yaml" --out "$tmp/trace64"
# Both integer variables read by one strict reader (harness/parse_number.h): anything but digits
# in range is said, and the run goes on without it.
for v in abc -1 0x1 1e3 " 1" 1048577 99999999999999999999999; do
  check "SB_MEMORY_TRACE='$v' is said to be no rank number" 0 \
    "SB_MEMORY_TRACE='$v' is not a rank number \(0, 1, \.\.\.\): nothing is traced" -- \
    env SB_MEMORY_TRACE="$v" "$sb" run "$tmp/ok.yaml" --out "$tmp/trace-bad"
done
for v in 0 abc 86401 -5 " 60"; do
  check "STRATBENCH_PLOT_TIMEOUT_S='$v': said, the default used" 0 \
    "STRATBENCH_PLOT_TIMEOUT_S='$v' is not a number of seconds from 1 to 86400; the plots get 600 s" -- \
    env STRATBENCH_PYTHON=/bin/true STRATBENCH_PLOT_TIMEOUT_S="$v" "$sb" report "$tmp/keep" --out "$tmp/rep-timeout"
done
# OMP_NUM_THREADS far above the cores slowed a run past 90 s without a word: warned before it.
# LibTorch 1.13 takes the count as given; PyTorch 2.13 caps it at the cores itself (no contention,
# no warning): the run's torch_version says which.
env OMP_NUM_THREADS=$(( $(nproc) * 2 )) "$sb" run "$tmp/ok.yaml" --out "$tmp/omp" > "$tmp/omp.log" 2>&1
if grep -q ',1\.13' "$tmp/omp/results.csv"; then
  grep -qE "warning: OMP_NUM_THREADS=[0-9]+ asks for more intra-op threads than this machine's [0-9]+ cores" \
    "$tmp/omp.log" && pass "OMP_NUM_THREADS above the cores on LibTorch 1.13: the run warns" ||
    fail "OMP_NUM_THREADS above the cores on LibTorch 1.13: no warning"
else
  ! grep -q "asks for more intra-op threads" "$tmp/omp.log" &&
    pass "OMP_NUM_THREADS above the cores on PyTorch 2.x (capped at the cores): no false warning" ||
    fail "OMP_NUM_THREADS on PyTorch 2.x: warned though LibTorch capped the threads"
fi
# A cost profile given as --noise said only "lacks key 'floor_pct'": named as what it is.
bad "report --noise given a cost profile is exit 2 naming what it is" \
  "mesh2.json: a cost profile .*not a noise file" \
  "$sb" report "$tmp/keep" --noise "$src/ci/fuzz/corpus/profile/mesh2.json" --no-plots --out "$tmp/rep-noise-prof"

# The ninth sweep (a reviewer's, on the fixed build). Damage: a suite, golden file or cost
# profile kept in --out under a name the run writes (results.csv, .stratbench.lock) was replaced
# by the results or deleted with the lock, exit 0: refused before any row, the file kept.
mkdir -p "$tmp/r9a" && cp "$tmp/ok.yaml" "$tmp/r9a/results.csv"
check "run OUT/results.csv --out OUT: exit 2 before any row, the suite kept" 2 \
  "r9a/results.csv \(the suite file\) is .*a file this run writes into --out" -- \
  "$sb" run "$tmp/r9a/results.csv" --out "$tmp/r9a"
cmp -s "$tmp/ok.yaml" "$tmp/r9a/results.csv" && pass "the suite named results.csv is kept" ||
  fail "run replaced its own suite with its results"
mkdir -p "$tmp/r9b" && cp "$tmp/ok.yaml" "$tmp/r9b/.stratbench.lock"
check "run OUT/.stratbench.lock --out OUT: exit 2, the suite kept" 2 \
  "\(the suite file\) is .*stratbench.lock, a file this run writes" -- \
  "$sb" run "$tmp/r9b/.stratbench.lock" --out "$tmp/r9b"
[ -s "$tmp/r9b/.stratbench.lock" ] && pass "the suite named .stratbench.lock is kept" ||
  fail "run deleted its own suite with the lock"
mkdir -p "$tmp/r9c" && sed 's/^suite: ok/suite: ok\ngolden: results.json/' "$tmp/ok.yaml" > "$tmp/r9c/g.yaml"
check "a golden file named results.json with --out the suite's folder: exit 2 before any row" 2 \
  "\(the suite's golden file\) is .*results.json, a file this run writes" -- \
  "$sb" run "$tmp/r9c/g.yaml" --out "$tmp/r9c" --write-golden
[ ! -e "$tmp/r9c/results.csv" ] && pass "no row ran before the golden refusal" ||
  fail "the golden file's clash was found after the rows ran"
mkdir -p "$tmp/r9d" && cp "$src/ci/fuzz/corpus/profile/mesh2.json" "$tmp/r9d/results.json"
check "a cost profile at OUT/results.json: exit 2, the profile kept" 2 \
  "\(--cost-profile\) is .*results.json, a file this run writes" -- \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/r9d" --cost-profile "$tmp/r9d/results.json"
cmp -s "$src/ci/fuzz/corpus/profile/mesh2.json" "$tmp/r9d/results.json" &&
  pass "the cost profile is kept" || fail "run replaced the cost profile with its results"
# Results lost: a name with a space at an end read back as another (the CSV reader trims it), so
# report refused the run's own results; refused at run.
for n in '" a"' '"a "'; do
  sed "s/- name: lin/- name: $n/" "$tmp/ok.yaml" > "$tmp/space.yaml"
  bad "a case name $n with a space at an end is exit 2" "key 'name' must not (start|end) with a space" \
    "$sb" run "$tmp/space.yaml" --out "$tmp/keep"
done
sed 's/^suite: ok/suite: "ok "/' "$tmp/ok.yaml" > "$tmp/space.yaml"
bad "a suite name ending in a space is exit 2" "key 'suite' must not end with a space" \
  "$sb" run "$tmp/space.yaml" --out "$tmp/keep"
# Injection: a commit name a spreadsheet runs as a formula (=HYPERLINK from results.csv).
bad "STRATBENCH_GIT_SHA starting with = is exit 2" "STRATBENCH_GIT_SHA '=HYPERLINK.*' starts with '='" \
  env STRATBENCH_GIT_SHA='=HYPERLINK("http://evil","x")' "$sb" run "$tmp/ok.yaml" --out "$tmp/keep"
# Injection: ESC and BEL from a results folder's name and a noise file's host reached report.md,
# report.html and history.csv raw: written as escapes.
esc=$(printf '\033[31mRED\033]8;;http:evil\007')
mkdir -p "$tmp/r9e/hist"
cp -r "$tmp/keep" "$tmp/r9e/$esc" && cp -r "$tmp/keep" "$tmp/r9e/hist/$esc"
"$sb" noise "$tmp/keep" "$tmp/keep2" --out "$tmp/r9e/n.json" > /dev/null 2>&1
python3 - "$tmp/r9e/n.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["host"] = "\x1b[31mhost\x07"
json.dump(d, open(sys.argv[1], "w"))
PY
check "report on a folder named with ESC, a noise host with ESC: exit 0" 0 "" -- \
  "$sb" report "$tmp/r9e/$esc" --noise "$tmp/r9e/n.json" --history "$tmp/r9e/hist" \
  --no-plots --out "$tmp/r9e/rep"
if grep -qP '[\x1b\x07]' "$tmp/r9e/rep/report.md" "$tmp/r9e/rep/report.html" "$tmp/r9e/rep/history.csv"; then
  fail "ESC or BEL reached report.md, report.html or history.csv raw"
else
  grep -q 'u001b' "$tmp/r9e/rep/report.md" && pass "ESC and BEL written as escapes in the report" ||
    fail "the report lost the folder's name instead of escaping it"
fi
# Hang: an interpreter for the plots that never returns held the report forever; past
# STRATBENCH_PLOT_TIMEOUT_S the plots are missing, said, and the report is written.
printf '#!/bin/sh\nexec sleep 1000\n' > "$tmp/hangpy" && chmod +x "$tmp/hangpy"
check "report whose plot interpreter hangs: stopped at the deadline, the report written" 0 \
  "did not finish within 2 s \(STRATBENCH_PLOT_TIMEOUT_S\)" -- \
  env STRATBENCH_PYTHON="$tmp/hangpy" STRATBENCH_PLOT_TIMEOUT_S=2 timeout 60 "$sb" report "$tmp/keep" --out "$tmp/rep-hang"
[ -s "$tmp/rep-hang/report.md" ] && pass "the report is written past a hung plot interpreter" ||
  fail "no report.md after the plot interpreter's deadline"
# A report stopped from outside (timeout, Ctrl-C) stops its plot interpreter with it (in a process
# group of its own it ran on, orphaned).
marker="1777$$"  # this run's own: another run's interpreter is not this one's
printf '#!/bin/sh\nexec sleep %s\n' "$marker" > "$tmp/hangpy2" && chmod +x "$tmp/hangpy2"
# (Exec'd, not a fork of the test's core server: the check is about the process and its child.)
timeout 3 env STRATBENCH_CORE_SERVER= STRATBENCH_PYTHON="$tmp/hangpy2" "$sb" report "$tmp/keep" \
  --out "$tmp/rep-int" > /dev/null 2>&1
sleep 1
if pgrep -f "sleep $marker" > /dev/null; then
  pkill -f "sleep $marker"
  fail "a report stopped by timeout left its plot interpreter running"
else
  pass "a report stopped by timeout leaves no plot interpreter behind"
fi
# Wrong party blamed: a linear shape of 2^63 - 1 outputs reached the reference (exit 1, "reference
# failed"); refused as the shape's (exit 2).
sed 's/out_features: 8/out_features: 9223372036854775807/' "$tmp/ok.yaml" > "$tmp/hugelin.yaml"
bad "a linear out_features of 2^63-1 is exit 2 naming the shape" "make a tensor of more than 2\^40 elements" \
  "$sb" run "$tmp/hugelin.yaml" --out "$tmp/keep"
# OMP_NUM_THREADS that is no count: LibTorch's own warning only; said in the run's words.
check "OMP_NUM_THREADS=99999999999: the run says it is no thread count" 0 \
  "OMP_NUM_THREADS='99999999999' is not a thread count" -- \
  env OMP_NUM_THREADS=99999999999 "$sb" run "$tmp/ok.yaml" --out "$tmp/omp2"
# Damage: solve parallel --verify-out DIR replaced DIR/suite.yaml, a user's file or what a link
# there named, or the model itself: refused before the search.
if [ -f "$tmp/view_ok.pt" ]; then
  mkdir -p "$tmp/vo1" "$tmp/vo2" "$tmp/vo3"
  echo "precious" > "$tmp/vo-mine.yaml" && ln -s "$tmp/vo-mine.yaml" "$tmp/vo1/suite.yaml"
  echo "my suite" > "$tmp/vo2/suite.yaml"
  cp "$tmp/view_ok.pt" "$tmp/vo3/suite.yaml"
  for c in "vo1|is a symbolic link" "vo2|solve parallel did not write it" "vo3|is the file --model names"; do
    d=${c%%|*}
    model=$([ "$d" = vo3 ] && echo "$tmp/vo3/suite.yaml" || echo "$tmp/view_ok.pt")
    check "solve parallel --verify-out $d: exit 2 before the search" 2 "${c#*|}" -- \
      "$sb" solve parallel --model "$model" --input '[2, 6]' --ranks 2 --verify 1 --verify-out "$tmp/$d"
  done
  [ "$(cat "$tmp/vo-mine.yaml")" = precious ] && [ "$(cat "$tmp/vo2/suite.yaml")" = "my suite" ] &&
    cmp -s "$tmp/view_ok.pt" "$tmp/vo3/suite.yaml" && pass "--verify-out kept every file" ||
    fail "solve parallel --verify-out replaced a file it did not write"
fi

# The tenth sweep (the same reviewer, on the round-9 build). Damage: a file report reads kept in
# its --out under a name it writes (a baseline as summary.csv) was replaced, exit 0.
mkdir -p "$tmp/r10a" && "$sb" report "$tmp/keep" --out "$tmp/r10a" --no-plots > /dev/null 2>&1
cp "$tmp/keep2/results.csv" "$tmp/r10a/summary.csv"
check "report --baseline OUT/summary.csv --out OUT: exit 2, the baseline kept" 2 \
  "summary.csv \(--baseline\) is a file the report writes into" -- \
  "$sb" report "$tmp/keep" --baseline "$tmp/r10a/summary.csv" --out "$tmp/r10a" --no-plots
cmp -s "$tmp/keep2/results.csv" "$tmp/r10a/summary.csv" && pass "the baseline kept as summary.csv is kept" ||
  fail "report replaced its own baseline"
# Damage: a case's model kept in --out as results.csv was replaced by the results (exit 0).
if [ -f "$tmp/view_ok.pt" ]; then
  mkdir -p "$tmp/r10b" && cp "$tmp/view_ok.pt" "$tmp/r10b/results.csv"
  printf 'suite: tsout\ndefaults: {repetitions: 1, min_time_s: 0.0001}\ncases:\n  - name: m\n    workload: torchscript\n    shape: {file: "%s", inputs: [[2, 6]]}\n    mesh: 2\n    strategies: ["sharding/fsdp/ddp"]\n' \
    "$tmp/r10b/results.csv" > "$tmp/tsout.yaml"
  check "a model at OUT/results.csv: exit 2 before any row, the model kept" 2 \
    "r10b/results.csv \(a file case 'm' reads\) is .*a file this run writes" -- \
    "$sb" run "$tmp/tsout.yaml" --out "$tmp/r10b"
  cmp -s "$tmp/view_ok.pt" "$tmp/r10b/results.csv" && pass "the model kept as results.csv is kept" ||
    fail "run replaced a case's model with its results"
fi
# Results lost: --trace DIR --out DIR (new) with a suite named results.csv: the trace folder took
# the results' name after every row ran.
sed 's/^suite: ok/suite: results.csv/' "$tmp/ok.yaml" > "$tmp/sr.yaml"
check "run --trace OUT --out OUT, suite named results.csv: exit 2 before any row" 2 \
  "\(--trace's folder of the suite\) is .*a file this run writes into --out" -- \
  "$sb" run "$tmp/sr.yaml" --out "$tmp/r10c" --trace "$tmp/r10c"
[ ! -e "$tmp/r10c/results.json" ] && pass "no row ran before the trace clash was refused" ||
  fail "the trace clash was found after the rows ran"
# Injection: ESC and BEL in a path printed on a success line ("results: ...") reached the terminal.
esc=$(printf 'o\033]0;PWNED\007\033[31m')
check "a run whose --out holds ESC and BEL: the line shows them as escapes" 0 'u001b\]0;PWNED\\u0007' -- \
  "$sb" run "$tmp/ok.yaml" --out "$tmp/$esc"
grep -qP '[\x1b\x07]' "$tmp/out" && fail "ESC or BEL printed raw to the terminal" ||
  pass "no ESC or BEL printed raw"
# A commit name with a tab at its start read back trimmed, as a formula.
bad "STRATBENCH_GIT_SHA starting with a tab is exit 2" "starts or ends with a space or a tab" \
  env STRATBENCH_GIT_SHA="$(printf '\t=1+1')" "$sb" run "$tmp/ok.yaml" --out "$tmp/keep"

# The eleventh sweep (the same reviewer, on the tenth's build). A crash: a path or a commit name
# that is not UTF-8 aborted a run (JSON holds UTF-8 only) after it had taken its folder's lock.
cp "$tmp/ok.yaml" "$tmp/$(printf 's\377.yaml')"
check "a suite path that is not UTF-8: exit 2 naming the argument, no folder taken" 2 \
  "argument 2 .* is not UTF-8 text \(byte 0xff" -- \
  "$sb" run "$tmp/$(printf 's\377.yaml')" --out "$tmp/r11a"
[ ! -e "$tmp/r11a" ] && pass "no results folder for a refused argument" || fail "a lock left behind"
bad "STRATBENCH_GIT_SHA that is not UTF-8 is exit 2" "STRATBENCH_GIT_SHA is not UTF-8 text" \
  env STRATBENCH_GIT_SHA="$(printf '\377\376')" "$sb" run "$tmp/ok.yaml" --out "$tmp/keep"
# Damage: memory_snapshot.py wrote through a hard link to a run's results.csv; the side-by-side
# table replaced the results.json it read. Both write beside and rename, and refuse their inputs.
SB_MEMORY_TRACE=0 "$sb" run "$tmp/ok.yaml" --out "$tmp/r11b" > /dev/null 2> "$tmp/r11b.trace"
ln -f "$tmp/r11b/results.csv" "$tmp/r11b-snap.pkl" && cp "$tmp/r11b/results.csv" "$tmp/r11b.keep"
check "memory_snapshot.py onto a hard link of results.csv: written, the results kept" 0 "live blocks" -- \
  python3 "$src/reports/memory_snapshot.py" "$tmp/r11b.trace" "$tmp/r11b-snap.pkl"
cmp -s "$tmp/r11b/results.csv" "$tmp/r11b.keep" && pass "results.csv kept beside a hard link replaced" ||
  fail "memory_snapshot.py wrote through a hard link into results.csv"
cp "$tmp/r11b/results.json" "$tmp/r11b.json.keep"
bad "torch_side_by_side.py --out the results it reads is exit 2" "is the file the results names" \
  python3 "$src/reports/torch_side_by_side.py" "$tmp/r11b/results.json" --out "$tmp/r11b/results.json"
cmp -s "$tmp/r11b/results.json" "$tmp/r11b.json.keep" || fail "torch_side_by_side.py replaced its results"
echo '{"records": [{"case": 1}]}' > "$tmp/r11c.json"
bad "torch_side_by_side.py on records of another shape is exit 2, no traceback" \
  "r11c.json: not a stratbench results.json \(records\[0\] lacks" \
  python3 "$src/reports/torch_side_by_side.py" "$tmp/r11c.json"
# Injection: case names written raw into the side-by-side's Markdown table.
python3 - "$tmp/r11d.json" <<'PY'
import json, sys
rec = lambda sid, twin: {"suite": "s", "case": "<img src=x onerror=alert(1)>[l](javascript:a)",
                         "strategy_id": sid, "status": "pass", "details": {"executor": {"twin": twin}}}
json.dump({"records": [rec("torch/ddp", "sharding/fsdp/ddp"), rec("sharding/fsdp/ddp", "")]},
          open(sys.argv[1], "w"))
PY
check "torch_side_by_side.py: a case name's markup is escaped" 0 '\\<img src=x onerror=alert\\\(1\\\)\\>' -- \
  python3 "$src/reports/torch_side_by_side.py" "$tmp/r11d.json"
# An interpreter that exits 0 without drawing said "(0 plots)" and nothing missing.
check "report with STRATBENCH_PYTHON=/bin/true: the plots are named as missing" 0 \
  "exited 0 without running .*make_plots.py" -- \
  env STRATBENCH_PYTHON=/bin/true "$sb" report "$tmp/keep" --out "$tmp/rep-true"

# The twelfth sweep. Results lost: a model's parameter named with ESC or ';' went raw into
# tensor_err_ratio, and report refused the run's own results.csv: refused at import, naming it;
# a zero-width space (one name shown as another) as a case name is. LibTorch's loader (1.13 and
# 2.13) refuses that file first (its reader of the saved code takes none of the escapes the writer
# made of a non-ASCII name); either way exit 2 naming it, and no row shows the name.
/usr/bin/python3 - "$tmp" <<'PY' 2>/dev/null
import sys, torch
for tag, name in (("esc", "w\x1b]0;PWN\x07"), ("semi", "a;b=c"), ("zwsp", "w\u200bx")):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_parameter(name, torch.nn.Parameter(torch.randn(6, 4)))
        def forward(self, x):
            return x @ getattr(self, name)
    torch.jit.trace(M(), torch.randn(2, 6)).save(sys.argv[1] + "/pname_%s.pt" % tag)
PY
for c in "esc|holds the control character 0x1b at byte 1" "semi|holds ';'" \
         "zwsp|(holds a Unicode control or invisible character U\+200B at byte 1|not a TorchScript file)"; do
  k=${c%%|*}
  [ -f "$tmp/pname_$k.pt" ] || continue
  printf 'suite: pname\ndefaults: {repetitions: 1, min_time_s: 0.0001}\ncases:\n  - name: m\n    workload: torchscript\n    shape: {file: "%s", inputs: [[2, 6]]}\n    mesh: 2\n    strategies: ["sharding/fsdp/ddp"]\n' \
    "$tmp/pname_$k.pt" > "$tmp/pname.yaml"
  bad "a model whose parameter name $c: exit 2 naming it" "pname_$k.pt: (the parameter named .* )?${c#*|}" \
    "$sb" run "$tmp/pname.yaml" --out "$tmp/keep"
done
# Hang, crash and injection in the Python tools: a FIFO or /dev/zero as the side-by-side's
# results or noise_study.py's run, a missing run, a name with ESC in memory_trace.py's output.
mkfifo "$tmp/r12.fifo"
bad "torch_side_by_side.py on a FIFO is exit 2 at once" "r12.fifo: not a regular file" \
  python3 "$src/reports/torch_side_by_side.py" "$tmp/r12.fifo"
mkdir -p "$tmp/r12run" && ln -sf /dev/zero "$tmp/r12run/results.csv"
bad "noise_study.py on a run whose results.csv is /dev/zero is exit 2 at once" "results.csv: not a regular file" \
  python3 "$src/reports/noise_study.py" "$tmp/r12run" "$tmp/keep"
bad "noise_study.py on a missing run is exit 2, no traceback" "nothere/results.csv: no such file" \
  python3 "$src/reports/noise_study.py" "$tmp/nothere" "$tmp/keep"
check "memory_trace.py naming a path with ESC shows it escaped" 2 'u001b\]0;P\\u0007: no such file' -- \
  python3 "$src/reports/memory_trace.py" "$tmp/$(printf 'x\033]0;P\007')"
# The thirteenth sweep: tracebacks left in the Python tools (a count of trials of 0, a time no
# run writes, a number past a float).
bad "noise_study.py --trials 0 is exit 2" "--trials: expected a count of trials from 1" \
  python3 "$src/reports/noise_study.py" "$tmp/keep" "$tmp/keep2" --trials 0
cp -r "$tmp/keep2" "$tmp/r13nan" && edit_first_row "$tmp/r13nan/results.csv" 'r["time_us_median"] = "nan"'
bad "noise_study.py on a time of nan is exit 2 naming it" "time_us_median nan is not a positive number" \
  python3 "$src/reports/noise_study.py" "$tmp/keep" "$tmp/r13nan"
python3 - "$tmp/r13ovf.json" <<'PY'
import json, sys
rec = lambda sid, twin, t: {"suite": "s", "case": "c", "strategy_id": sid, "status": "pass",
                            "time_us_median": t, "details": {"executor": {"twin": twin}}}
json.dump({"records": [rec("torch/ddp", "x", 10 ** 400), rec("x", "", 1)]}, open(sys.argv[1], "w"))
PY
bad "torch_side_by_side.py on a time past a float is exit 2, no traceback" "r13ovf.json: not a stratbench results.json" \
  python3 "$src/reports/torch_side_by_side.py" "$tmp/r13ovf.json"
# The fourteenth sweep: memory_trace.py reading an endless standard input filled memory (a
# MemoryError traceback): it reads at most the bound files have.
check "memory_trace.py - < /dev/zero: exit 2 at its bound, no traceback" 2 \
  "standard input: more than the [0-9]+ bytes this tool reads" -- \
  bash -c 'ulimit -v 4000000; timeout 120 python3 "$1/reports/memory_trace.py" - < /dev/zero' _ "$src"

finish
