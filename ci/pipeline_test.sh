#!/usr/bin/env bash
# End-to-end checks of `stratbench solve pipeline` (strategies/pipeline/schedule.h): each
# built-in schedule's dry run with the bubble the literature gives it, the CSV format written
# and read back, a schedule that uses an activation before it is made (exit 1 naming the rank,
# the action and what it waits for), a per-stage profile, a Chrome trace with one thread per
# rank, and malformed input (exit 2 naming the file, line, cell or key).
# Usage: ci/pipeline_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

for s in gpipe 1f1b zb-h1; do
  check "$s on 4 stages, 8 micro-batches" 0 "" -- \
    "$sb" solve pipeline --stages 4 --microbatches 8 --schedule "$s" --out "$tmp/$s.json"
done
check "interleaved-1f1b, 2 stages per rank" 0 "" -- "$sb" solve pipeline --stages 4 \
  --microbatches 8 --schedule interleaved-1f1b --virtual-stages 2 --out "$tmp/il.json"
# Uniform costs, F 1 and B 2 (I 1, W 1) per stage: GPipe's and 1F1B's bubble (S-1)/(M+S-1),
# ZB-H1's (S-1)(F+I-W) of idle time per rank, 1F1B's activations S - r in flight.
check "the bubbles and activations the literature gives each schedule" 0 "ok" -- \
  python3 - "$tmp" <<'PY'
import json, sys
d = {s: json.load(open(f"{sys.argv[1]}/{s}.json")) for s in ("gpipe", "1f1b", "zb-h1", "il")}
S, M = 4, 8
for s in ("gpipe", "1f1b"):
    assert abs(d[s]["bubble_fraction"] - (S - 1) / (M + S - 1)) < 1e-12, (s, d[s]["bubble_fraction"])
assert d["zb-h1"]["step_time_us"] == M * 3 + (S - 1) * 1, d["zb-h1"]["step_time_us"]
assert [r["peak_microbatches_in_flight"] for r in d["1f1b"]["per_rank"]] == [4, 3, 2, 1]
assert [r["peak_microbatches_in_flight"] for r in d["gpipe"]["per_rank"]] == [8] * 4
assert d["il"]["stages"] == 8 and [r["stages"] for r in d["il"]["per_rank"]][0] == [0, 4]
for s, j in d.items():
    for r in j["per_rank"]:
        assert abs(r["busy_us"] + r["idle_us"] - j["step_time_us"]) < 1e-9, s
print("ok")
PY

check "--write-csv writes torch.distributed.pipelining's format" 0 "" -- \
  "$sb" solve pipeline --stages 4 --microbatches 8 --schedule zb-h1 --write-csv "$tmp/zb.csv" \
  --out "$tmp/zb-again.json"
check "the CSV read back runs the same schedule" 0 "step 27 us" -- \
  "$sb" solve pipeline --csv "$tmp/zb.csv" --out "$tmp/zb-csv.json"
check "the first row of the CSV is rank 0's actions" 0 "^0F0,0F1,0F2,0F3,0I0" -- head -1 "$tmp/zb.csv"

printf '0F0,0B0\n1B0,1F0\n' >"$tmp/early.csv"
check "an activation used before it is made: exit 1 naming the rank, action and what it waits for" 1 \
  "cannot finish: rank 1 waits at 1B0 for 1F0, which it runs itself later" -- \
  "$sb" solve pipeline --csv "$tmp/early.csv" --out "$tmp/early.json"
check "the deadlocked run's JSON says every waiting rank" 0 "2 waiting" -- \
  python3 -c "import json; d = json.load(open('$tmp/early.json')); print(len(d['waiting']), 'waiting')"

cat >"$tmp/profile.json" <<'JSON'
{"p2p_us": 0.5,
 "stages": [{"forward_us": 1, "backward_us": 2, "activation_bytes": 1000},
            {"forward_us": 2, "backward_us": 4, "activation_bytes": 3000}]}
JSON
check "a per-stage profile: the slow stage paces it, bytes held per rank" 0 "ok" -- bash -c \
  "'$sb' solve pipeline --stages 2 --microbatches 4 --schedule 1f1b --profile '$tmp/profile.json' |
   python3 -c 'import json,sys; d=json.load(sys.stdin); r=d[\"per_rank\"];
assert r[0][\"peak_activation_bytes\"] == 2000 and r[1][\"peak_activation_bytes\"] == 3000, r
assert d[\"step_time_us\"] > 4 * 6, d[\"step_time_us\"]; print(\"ok\")'"
check "--trace: a Chrome trace, one thread per rank" 0 "ok" -- bash -c \
  "'$sb' solve pipeline --stages 4 --microbatches 4 --trace '$tmp/trace.json' --out '$tmp/t.json' &&
   python3 -c 'import json; e=json.load(open(\"$tmp/trace.json\"))[\"traceEvents\"];
assert sorted({x[\"tid\"] for x in e}) == [0, 1, 2, 3]; assert sum(x[\"ph\"] == \"X\" for x in e) == 32; print(\"ok\")'"

check "reports/plots/pipeline_plot.py draws the timeline (one row per rank)" 0 "a png" -- \
  bash -c "/usr/bin/python3 '$src/reports/plots/pipeline_plot.py' '$tmp/zb-h1.json' '$tmp/zb.png' &&
    python3 -c \"import sys; sys.stdout.write('a png' if open('$tmp/zb.png', 'rb').read(8) == bytes([137, 80, 78, 71, 13, 10, 26, 10]) else 'not a png')\""
check "the plot refuses a run that does not finish" 1 "does not finish" -- \
  /usr/bin/python3 "$src/reports/plots/pipeline_plot.py" "$tmp/early.json" "$tmp/early.png"

# A model's per-layer costs (rotor's chain notation, as `solve checkpoint` reads them) cut into
# the stages: balanced, the slow layer gets a stage of its own; by layer count, it does not.
cat >"$tmp/chain.json" <<'JSON'
{"ftime": [1, 1, 1, 6, 1, 1], "btime": [2, 2, 2, 12, 2, 2, 0],
 "x": [1, 1, 1, 1, 1, 1, 1], "xbar": [1, 10, 10, 10, 40, 10, 10],
 "ftmp": [0, 0, 0, 0, 0, 0], "btmp": [0, 0, 0, 0, 0, 0, 0]}
JSON
check "--chain: the balanced cut, and the stages' costs and activations from its layers" 0 "ok" -- bash -c \
  "'$sb' solve pipeline --stages 3 --microbatches 6 --chain '$tmp/chain.json' > '$tmp/bal.json' &&
   '$sb' solve pipeline --stages 3 --microbatches 6 --chain '$tmp/chain.json' --cut layers > '$tmp/lay.json' &&
   python3 -c 'import json; b=json.load(open(\"$tmp/bal.json\")); l=json.load(open(\"$tmp/lay.json\"))
assert b[\"stage_layers\"] == [[0, 3], [3, 4], [4, 6]], b[\"stage_layers\"]
assert l[\"stage_layers\"] == [[0, 2], [2, 4], [4, 6]], l[\"stage_layers\"]
assert b[\"step_time_us\"] < l[\"step_time_us\"], (b[\"step_time_us\"], l[\"step_time_us\"])
assert b[\"per_rank\"][1][\"peak_activation_bytes\"] == 40 * 2, b[\"per_rank\"][1]
print(\"ok\")'"
check "--chain with --profile: exit 2" 2 "one of them" -- "$sb" solve pipeline --stages 3 \
  --microbatches 6 --chain "$tmp/chain.json" --profile "$tmp/profile.json"
check "--chain with fewer layers than stages: exit 2" 2 "cannot cut 6 layers into 8 stages" -- \
  "$sb" solve pipeline --stages 8 --microbatches 8 --chain "$tmp/chain.json"

# Malformed input.
printf '0F0,0Z1\n' >"$tmp/bad.csv"
check "a cell that is not an action: exit 2 naming file, line and cell" 2 \
  "bad.csv:1: cell 2: '0Z1' is not an action" -- "$sb" solve pipeline --csv "$tmp/bad.csv"
printf '0F0,0B0\n0F1,0B1\n' >"$tmp/two.csv"
check "a stage on two ranks: exit 2" 2 "two.csv:2: cell 1: 0F1: stage 0 is on rank 0" -- \
  "$sb" solve pipeline --csv "$tmp/two.csv"
check "--csv with --stages: exit 2" 2 "drop --schedule, --stages" -- \
  "$sb" solve pipeline --csv "$tmp/two.csv" --stages 2
check "--csv with --schedule: exit 2" 2 "drop --schedule" -- \
  "$sb" solve pipeline --csv "$tmp/zb.csv" --schedule gpipe
printf '0F0\n1F0\n2F0\n3F99999\n' >"$tmp/sparse.csv"
check "a CSV naming far more stage-micro-batches than it has actions: exit 2 before any table" 2 \
  "micro-batches, which take at least 800000 actions; it has 4" -- \
  "$sb" solve pipeline --csv "$tmp/sparse.csv"
check "--csv of a device that never ends: refused before it is read" 2 "/dev/zero: not a regular file" -- \
  "$sb" solve pipeline --csv /dev/zero
printf '{"stages": [{"backward_us": 2, "backward_input_us": 5}]}' >"$tmp/halves.json"
check "a profile's input gradient longer than its backward: exit 2" 2 \
  "backward_input_us 5 is more than its backward_us 2" -- \
  "$sb" solve pipeline --stages 2 --microbatches 2 --schedule zb-h1 --profile "$tmp/halves.json"
check "no sizes: exit 2" 2 "--stages and --microbatches are needed" -- "$sb" solve pipeline
check "micro-batches not a multiple of the stages for interleaved: exit 2" 2 \
  "micro-batches in groups of the stages" -- "$sb" solve pipeline --stages 4 --microbatches 6 \
  --schedule interleaved-1f1b --virtual-stages 2
check "more actions than it takes: exit 2" 2 "stage-micro-batches a schedule may have" -- \
  "$sb" solve pipeline --stages 4096 --microbatches 100000
check "--stages 0: exit 2" 2 "stages" -- "$sb" solve pipeline --stages 0 --microbatches 4
printf '{"stages": [{"forward_us": 1}, {}, {}]}' >"$tmp/p3.json"
check "a profile of the wrong length: exit 2 naming the key" 2 "'stages' has 3 entries" -- \
  "$sb" solve pipeline --stages 2 --microbatches 4 --profile "$tmp/p3.json"
check "--out onto a device: refused, nothing replaced" 2 "only a regular file" -- \
  "$sb" solve pipeline --stages 2 --microbatches 4 --out /dev/null
# Per-action bytes: GPipe on 2 stages, 2 micro-batches, F leaving 10 (15 at its height), B
# freeing 10 (5 at its height): each rank's peak is F1's, 10 + 15 = 25, by hand.
printf '{"stages": [{"forward_net_bytes": 10, "forward_peak_bytes": 15, "backward_net_bytes": -10, "backward_peak_bytes": 5}]}' \
  >"$tmp/bytes.json"
check "per-action bytes: each rank's peak walked in its order" 0 "ok 25 25" -- bash -c \
  "'$sb' solve pipeline --stages 2 --microbatches 2 --schedule gpipe --profile '$tmp/bytes.json' \
     --out '$tmp/bytes-run.json' >/dev/null && python3 -c \"
import json; r = json.load(open('$tmp/bytes-run.json'))['per_rank']
print('ok', *[int(x['peak_bytes']) for x in r])\""
printf '{"stages": [{"backward_weigth_net_bytes": 10}]}' >"$tmp/badkey.json"
check "a misspelt bytes key: exit 2 naming it" 2 "unknown key 'stages\[0\].backward_weigth_net_bytes'" -- \
  "$sb" solve pipeline --stages 2 --microbatches 2 --profile "$tmp/badkey.json"
finish
