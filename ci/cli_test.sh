#!/usr/bin/env bash
# End-to-end checks of the stratbench CLI: exit codes, messages, and that bad input leaves an
# existing result file untouched. Usage: ci/cli_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# A small real run: every ShardedTensor strategy on the uneven 13-feature cases.
check "run passes and writes results" 0 "total +[0-9]+ +0 +0 +0" -- \
  "$sb" run "$src/suites/smoke.yaml" --filter sharded_tensor --out "$tmp/res" --repetitions 2
rows=$(grep -c ',pass,' "$tmp/res/results.csv")
[ "$rows" -ge 12 ] && pass "results.csv has $rows pass rows" || fail "results.csv pass rows: $rows"
python3 - "$tmp/res" <<'PY' && pass "results.json's run id is every row's" || fail "run ids differ"
import csv, json, sys
run = json.load(open(sys.argv[1] + "/results.json"))["run"]["run_id"]
rows = {r["run_id"] for r in csv.DictReader(open(sys.argv[1] + "/results.csv"))}
sys.exit(0 if rows == {run} else 1)
PY
cp "$tmp/res/results.csv" "$tmp/before.csv"

cat >"$tmp/bad.yaml" <<'YAML'
cases:
  - name: a
    workload: linear
    shape: {input: [4, 16], out_features: 8}
    mesh: 2x2
    strategie: [x]
YAML
check "malformed suite names file, line and key" 2 "bad.yaml:6: unknown key 'strategie'" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/res"
cmp -s "$tmp/before.csv" "$tmp/res/results.csv" && pass "bad input left results.csv untouched" ||
  fail "results.csv changed"
check "filter selecting nothing" 2 "selects no strategy" -- \
  "$sb" run "$src/suites/smoke.yaml" --filter nothing-matches-this --out "$tmp/res"
check "mesh size not the world size" 2 "but the world size is 3" -- \
  "$sb" run "$src/suites/smoke.yaml" --world-size 3 --out "$tmp/res"
check "missing suite file" 2 "cannot read the suite file" -- "$sb" run "$tmp/none.yaml"
check "unknown option" 2 "" -- "$sb" run "$src/suites/smoke.yaml" --bogus
check "list --json shows sharding sequences" 0 '"S01",' -- "$sb" list --json --filter 'S01R=S01R.RR/0'
# Family sharding: 45 Linear and redistribution strategies, 310 operator strategies for the
# canonical shapes, Megatron's two blocks, the 5 whole-model plans (4 auto-sharding algorithms, 1
# from a file), and PyTorch's own tensor parallelism run in Python ranks (torch/: tp, sp, a
# user's file). The families with pages of their own apart: fsdp (ddp, zero1-3, hsdp, with
# torch/ddp, fsdp2, fsdp2-keep, hsdp), pipeline (5 schedules and the CSV one, with torch's four),
# cp (three variants and torch/cp), moe (sharding/moe/ep, torch/ep), compose (torch/compose).
check "list --family sharding" 0 "^400 strategies" -- "$sb" list --family sharding
check "list --family fsdp" 0 "^9 strategies" -- "$sb" list --family fsdp
check "list --family pipeline" 0 "^11 strategies" -- "$sb" list --family pipeline
check "list --family cp" 0 "^4 strategies" -- "$sb" list --family cp
check "list --family moe" 0 "^2 strategies" -- "$sb" list --family moe
check "list --family compose" 0 "^1 strategies" -- "$sb" list --family compose
check "list --family names the families it knows" 2 \
  "bogus not in \{sharding,chunking,checkpointing,fsdp,pipeline,cp,moe,compose\}" -- \
  "$sb" list --family bogus
cmp -s "$tmp/before.csv" "$tmp/res/results.csv" || fail "results.csv changed"
check "list names each strategy's plantable faults" 0 \
  "^sharding/moe/ep .*\[faults: grads_scaled_by_ep, router_grad_partial" -- "$sb" list --filter '^sharding/moe/ep$'

# The newcomer's CLI (issue 62): every command in --help, launch among them; an unknown command
# named; --version with stratbench's version and commit; the exit codes at the end of every
# --help; one error prefix; --plant-fault without a fault says so.
check "--help lists every command, launch included" 0 "launch" -- "$sb" --help
for c in list run launch calibrate report solve graph; do
  grep -qE "^  $c( |$)" "$tmp/out" || fail "--help does not list $c"
done
check "an unknown command is named, with the list" 2 "unknown command 'bogus' \(expected one of: list, run, launch" -- \
  "$sb" bogus
check "--version says stratbench's version, its commit and LibTorch's" 0 \
  "^stratbench [0-9]+\.[0-9]+\.[0-9]+ \(git [0-9a-f]{7,}(-dirty)?, LibTorch [0-9.]+" -- "$sb" --version
for c in "run" "report" "list" "solve shard" "solve checkpoint" "solve pipeline" "launch"; do
  check "$c --help ends with the exit codes" 0 "Exit codes: 0 .*; 2 bad input" -- $sb $c --help
done
check "report without results: one prefix" 2 "^stratbench report: give results files" -- "$sb" report
grep -q "report: report:" "$tmp/out" && fail "report's error is prefixed twice" || pass "one prefix"
check "--case picks cases by name" 0 "total +[1-9][0-9]* +0 +0 +0" -- \
  "$sb" run "$src/suites/smoke.yaml" --case '^linear-64x16-mesh2x2$' --out "$tmp/case" --repetitions 1
python3 - "$tmp/case/results.csv" <<'PY' && pass "--case: only that case's rows" || fail "--case ran other cases"
import csv, sys
sys.exit(0 if {r["case"] for r in csv.DictReader(open(sys.argv[1]))} == {"linear-64x16-mesh2x2"} else 1)
PY
check "--case selecting nothing is exit 2 naming it" 2 "--case 'no-such-case'" -- \
  "$sb" run "$src/suites/smoke.yaml" --case no-such-case --out "$tmp/case2"
check "--plant-fault ID without '=FAULT' is exit 2 saying what is expected" 2 \
  "expected STRATEGY_ID=FAULT" -- \
  "$sb" run "$src/suites/smoke.yaml" --plant-fault sharding/moe/ep --out "$tmp/pf"
check "--plant-fault on an id holding '=' without a fault names the whole id and its faults" 2 \
  "no fault given \(expected sharding/linear/S0S1=S0R.RS1/0=FAULT, FAULT one of: " -- \
  "$sb" run "$src/suites/smoke.yaml" --plant-fault 'sharding/linear/S0S1=S0R.RS1/0' --out "$tmp/pf"

# The checkpointing suite's sweep with rotor: every feasible budget passes bitwise, the
# infeasible ones are unsupported rows, nothing fails.
check "checkpointing suite: rotor over the budget sweep" 0 "total +[0-9]+ +0 +0 +[0-9]+" -- \
  "$sb" run "$src/suites/checkpointing.yaml" --filter rotor --repetitions 2 --out "$tmp/ckpt"
grep -q 'densenet121/budget=0.2,.*checkpointing/rotor,.*,pass,' "$tmp/ckpt/results.csv" &&
  pass "rotor fits DenseNet-121 at 20% of its activation peak" ||
  fail "rotor at 20% on DenseNet-121"

# solve chunk: a plan under the limit, or exit 1 saying what the smallest plan needs.
shape='{"batch": 1, "seq": 1024, "d_model": 64, "heads": 4, "layers": 2}'
check "solve chunk prints a plan under the limit" 0 '"region": "block"' -- \
  "$sb" solve chunk --shape "$shape" --max-memory 7000000
check "solve chunk: no plan fits" 1 "fits --max-memory 1000 bytes; the smallest of" -- \
  "$sb" solve chunk --shape "$shape" --max-memory 1000
check "solve chunk: a bad shape names the key" 2 "shape key 'd_model' \(63\) must be a multiple" -- \
  "$sb" solve chunk --shape '{"d_model": 63}' --max-memory 1000
check "solve chunk: training is searched with the training estimate" 0 '"region": "block"' -- \
  "$sb" solve chunk --shape '{"mode": "training", "seq": 128, "d_model": 32, "heads": 4}' \
  --max-memory 1000000

# solve checkpoint: two unit stages, inputs 1, tapes 2 (worked out in checkpoint_solver_test).
echo '{"ftime":[1,1],"btime":[1,1,1],"x":[1,1,1],"xbar":[1,2,2],"ftmp":[0,0],"btmp":[0,0,0]}' \
  >"$tmp/chain.json"
check "solve checkpoint prints the schedule" 0 '"CF_0",' -- \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget 6
check "solve checkpoint predicts time and peak" 0 '"predicted_peak": 6' -- \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget 6
check "solve checkpoint: no schedule fits" 1 "fits a budget of 4 .*peaks at 7" -- \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget 4
echo '{"ftime":[1,1],"btime":[1,1],"x":[1,1,1],"xbar":[1,2,2],"ftmp":[0,0],"btmp":[0,0,0]}' \
  >"$tmp/short.json"
check "solve checkpoint: malformed chain" 2 "short.json: key 'btime' must have L\+1 = 3" -- \
  "$sb" solve checkpoint --chain "$tmp/short.json" --budget 6
echo '{"ftime": [1,' >"$tmp/broken.json"
check "solve checkpoint: not JSON" 2 "broken.json: not valid JSON" -- \
  "$sb" solve checkpoint --chain "$tmp/broken.json" --budget 6
check "solve checkpoint: unknown solver" 2 "" -- \
  "$sb" solve checkpoint --chain "$tmp/chain.json" --budget 6 --solver magic

# The GPU suite on a build or machine without CUDA: every row is skipped, saying why, and the
# run still succeeds (a CPU CI box can run the nightly suite's file without failing it).
"$sb" run "$src/suites/gpu.yaml" --out "$tmp/gpu" >"$tmp/gpu.log" 2>&1
gpu_rc=$?
if [ "$gpu_rc" = 0 ] && python3 - "$tmp/gpu/results.csv" <<'PY'; then
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ok = rows and all(r["status"] == "skipped" and r["message"].startswith("device cuda: ")
                  for r in rows)
if not ok:
    print({(r["status"], r["message"][:80]) for r in rows})
sys.exit(0 if ok else 1)
PY
  pass "suites/gpu.yaml without CUDA: every row skipped with the reason"
elif [ "$gpu_rc" = 0 ] && grep -q "cuda:0 (" "$tmp/gpu/results.csv" 2>/dev/null; then
  pass "suites/gpu.yaml ran on a GPU here (ci/gpu/run.sh checks its rows)"
else
  fail "suites/gpu.yaml without CUDA: $(tail -3 "$tmp/gpu.log")"
fi

# Executors run their backward through reference::backward, the rank's own autograd engine on
# a GPU: torch::autograd::backward there deadlocks ranks that communicate inside backward
# (the plan executor did, on the H100). The benchmark's raw-LibTorch baseline may.
uses=$(grep -rn "torch::autograd::backward\|\.backward(" "$src/strategies" "$src/examples" \
  --include=*.cpp --include=*.h | grep -v "strategies/chunking/estimator/" | grep -v ":[0-9]*: *//" || true)
[ -z "$uses" ] && pass "no executor runs its backward on LibTorch's default engine" ||
  fail "executors calling LibTorch's backward directly: $uses"

# SB_MEMORY_TRACE and reports/memory_trace.py: the peak rebuilt from the trace's lines equals
# the peak the tracker kept and the row recorded, for a chunked training step (one rank) and a
# sharded Linear (rank 0 of two), and what is live there is named by the operators that made it.
cat >"$tmp/trace.yaml" <<'EOF'
suite: trace
defaults: {seed: 1, repetitions: 1, min_time_s: 0.001}
cases:
  - name: train
    workload: gpt2_prefill
    shape: {batch: 2, seq: 256, d_model: 64, heads: 4, layers: 1, mode: training}
    mesh: 1
    strategies: ["chunking/attention/seq"]
    params: {chunk: 64}
  - name: lin
    workload: linear
    shape: {input: [4, 64, 128], out_features: 96, bias: true}
    mesh: 2
    strategies: ["sharding/linear/RS0=RR.RS0"]
EOF
SB_MEMORY_TRACE=0 "$sb" run "$tmp/trace.yaml" --out "$tmp/trace" >/dev/null 2>"$tmp/trace.err"
python3 "$src/reports/memory_trace.py" "$tmp/trace.err" >"$tmp/trace.txt"
trace_rc=$?
if [ "$trace_rc" = 0 ] && python3 - "$tmp/trace/results.csv" "$tmp/trace.txt" <<'PY'; then
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
text = open(sys.argv[2]).read()
peaks = [int(p) for p in re.findall(r"peak (\d+) B", text)]
want = [int(r["peak_mem_bytes"]) for r in rows]
named = "aten::_softmax_backward_data < SoftmaxBackward0" in text and "aten::addmm" in text
print(peaks, want, named)
sys.exit(0 if peaks == want and named else 1)
PY
  pass "memory_trace.py: the peaks the trace rebuilds are the rows', by operator"
else
  fail "memory_trace.py (exit $trace_rc): $(head -5 "$tmp/trace.txt")"
fi
# A trace that lost one free (a planted gap): the running live bytes no longer add up, and it
# says so; where the freed block's address is not reused before a step's peak, that peak's
# allocations do not add up either (MISMATCH). Which one shows depends on the allocator's
# addresses, so either message is the detection.
awk '/^mem -/ && !dropped {dropped=1; next} {print}' "$tmp/trace.err" >"$tmp/trace-gap.err"
check "memory_trace.py: a trace missing a line is reported" 3 "MISMATCH|a line is missing" -- \
  python3 "$src/reports/memory_trace.py" "$tmp/trace-gap.err"
check "memory_trace.py: no measured step" 2 "no measured step" -- \
  python3 "$src/reports/memory_trace.py" "$tmp/trace.yaml"

# reports/memory_snapshot.py: each measured step as a PyTorch memory snapshot that PyTorch's own
# torch.cuda._memory_viz reads (python3-torch's, in /usr/bin/python3): its blocks add up to the
# row's peak in stats() and in the segments flamegraph, and its trace has the step's events.
for step in 1 2; do
  check "memory_snapshot.py: step $step written" 0 "step $step, [0-9]+ live blocks" -- \
    python3 "$src/reports/memory_snapshot.py" "$tmp/trace.err" "$tmp/snap$step.pickle" --step "$step"
done
if /usr/bin/python3 -c "import torch.cuda._memory_viz" 2>/dev/null; then
  check "memory_snapshot.py: PyTorch's _memory_viz reads both, at the rows' peaks" 0 "viz ok" -- \
    /usr/bin/python3 - "$tmp/trace/results.csv" "$tmp/snap1.pickle" "$tmp/snap2.pickle" <<'PY'
import csv, pickle, sys
import torch.cuda._memory_viz as viz
rows = list(csv.DictReader(open(sys.argv[1])))
for row, path in zip(rows, sys.argv[2:]):
    snap = pickle.load(open(path, "rb"))
    peak = int(row["peak_mem_bytes"])
    stats = viz.stats(snap["segments"])
    lines = viz.segments(snap["segments"], format_flamegraph=lambda text: text).split("\n")
    flame = sum(int(l.rsplit(" ", 1)[1]) for l in lines if l.strip())
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    total = getattr(stats["total_size"], "value", stats["total_size"])  # a Bytes
    assert total == peak == flame, (path, stats, peak, flame)
    assert allocs and all(e["size"] > 0 and e["frames"] for e in allocs), path
print("viz ok")
PY
else
  echo "SKIP: memory_snapshot.py through _memory_viz: /usr/bin/python3 has no torch (python3-torch)"
fi
check "memory_snapshot.py: no such step" 3 "no measured step 9" -- \
  python3 "$src/reports/memory_snapshot.py" "$tmp/trace.err" "$tmp/snap9.pickle" --step 9
check "memory_snapshot.py: a trace missing a line is refused" 3 "a line is missing|add up to" -- \
  python3 "$src/reports/memory_snapshot.py" "$tmp/trace-gap.err" "$tmp/snapgap.pickle"


# The test scripts' fork server (cli/serve.h): a served command ends as the exec'd one does (the
# same output and exit code; killed, the same signal), the front's signals reach it, the front
# killed takes it along, and what a fork cannot carry (here OMP_NUM_THREADS) is exec'd.
if [ -n "${STRATBENCH_CORE_SERVER:-}" ]; then
  same() {  # NAME ARGS...: served and exec'd, the same output and exit code
    local name=$1 a b ra rb
    shift
    a=$("$sb" "$@" 2>&1); ra=$?
    b=$(STRATBENCH_CORE_SERVER= "$sb" "$@" 2>&1); rb=$?
    [ "$ra" = "$rb" ] && [ "$a" = "$b" ] && pass "served as exec'd: $name (exit $ra)" ||
      fail "served as exec'd: $name: exit $ra vs $rb; '${a:0:200}' vs '${b:0:200}'"
  }
  same "--help" --help
  same "an unknown command" frobnicate
  same "a suite that is missing" run "$tmp/missing.yaml" --out "$tmp/unused"
  same "list --json" list --json
  same "a bad number" run "$src/suites/smoke.yaml" --repetitions 0 --out "$tmp/unused"
  abs=$(cd "$build" && pwd)/stratbench
  ( cd "$tmp" && "$abs" run "$src/suites/smoke.yaml" --filter 'linear/RR=RR' --out rel --repetitions 1 \
      </dev/null >/dev/null 2>&1 )
  [ -f "$tmp/rel/results.csv" ] && pass "served: the front's working directory" ||
    fail "served: --out rel not written in the front's working directory"
  echo "suite: stdin" | "$sb" run /dev/stdin --out "$tmp/unused" >"$tmp/out" 2>&1
  grep -q "stdin" "$tmp/out" && pass "served: the front's standard input" || fail "served: stdin"
  long=("$src/suites/smoke.yaml" --repetitions 1000 --min-time 1)
  "$sb" run "${long[@]}" --out "$tmp/served" >/dev/null 2>&1 &
  front=$!
  pid=$(wait_lock "$tmp/served")
  [ -n "$pid" ] && [ "$pid" != "$front" ] && pass "served: the command is a fork of the server" ||
    fail "served: the lock's pid $pid is the front's ($front)"
  kill -TERM "$front"
  wait "$front"
  rc=$?
  STRATBENCH_CORE_SERVER= "$sb" run "${long[@]}" --out "$tmp/execd" >/dev/null 2>&1 &
  front=$!
  wait_lock "$tmp/execd" >/dev/null
  kill -TERM "$front"
  wait "$front"
  [ "$rc" = $? ] && pass "SIGTERM: the served command ends as the exec'd one (exit $rc)" ||
    fail "SIGTERM: served exit $rc"
  OMP_NUM_THREADS=3 "$sb" run "${long[@]}" --out "$tmp/omp" >/dev/null 2>&1 &
  front=$!
  pid=$(wait_lock "$tmp/omp")
  [ "$pid" = "$front" ] && pass "another OMP_NUM_THREADS than the server's: exec'd" ||
    fail "OMP_NUM_THREADS=3: the lock's pid $pid is not the front's ($front)"
  kill -KILL "$front"
  wait "$front" 2>/dev/null
  "$sb" run "${long[@]}" --out "$tmp/segv" >/dev/null 2>&1 &
  front=$!
  # No served command took the lock: the front is killed instead, and the check below fails.
  if pid=$(wait_lock "$tmp/segv"); then kill -SEGV "$pid"; else kill -KILL "$front"; fi
  wait "$front" 2>/dev/null
  rc=$?
  [ "$rc" = 139 ] && pass "the command killed by SIGSEGV: so is the front (exit 139)" ||
    fail "SIGSEGV: the front's exit $rc"
  "$sb" run "${long[@]}" --out "$tmp/killed" >/dev/null 2>&1 &
  front=$!
  pid=$(wait_lock "$tmp/killed") || pid=
  kill -KILL "$front"
  wait "$front" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if [ -z "$pid" ] || [ "$pid" = "$front" ]; then
    fail "the front killed: no served command took the lock"
  elif kill -0 "$pid" 2>/dev/null; then
    fail "the front killed: its command $pid still runs"
    kill -9 "$pid"
  else
    pass "the front killed (SIGKILL): its command goes too"
  fi
  # A background job ignores SIGINT; so does the command it runs, served as exec'd.
  "$sb" run "${long[@]}" --out "$tmp/ignint" >/dev/null 2>&1 &
  front=$!
  pid=$(wait_lock "$tmp/ignint") || pid=
  kill -INT "$front"
  sleep 1
  kill -0 "$front" 2>/dev/null && pass "SIGINT ignored by the front: its command runs on" ||
    fail "SIGINT ignored by the front: it ended"
  kill -TERM "$front"
  wait "$front" 2>/dev/null
  # A descriptor above 2 that exec would pass on (a process substitution) reaches the command.
  check "a <(...) argument: the command reads it" 2 "/dev/fd/[0-9]+:1: key 'cases' is missing" -- \
    "$sb" run <(echo "suite: fd") --out "$tmp/unused"
elif [ "${SB_NO_CORE_SERVER:-0}" = 1 ]; then
  echo "note: SB_NO_CORE_SERVER=1: the fork server's checks did not run"
else
  fail "no core server: the fork server's checks did not run"
fi

finish
