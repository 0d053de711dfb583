#!/usr/bin/env bash
# Every CPU suite on one build (one leg), for ci/legs_table.py: each suite's rows into
# OUT/SUITE/results.csv, one repetition each (the table compares rows, verdicts and peaks, not
# times). suites/gpu.yaml is left out (its rows are skipped without CUDA), and so are the long
# variants (checkpointing-full, chunking-long). The imported suite reads this build's models.
#
#   ci/legs_run.sh BUILD_DIR OUT
set -uo pipefail
build=$(cd "$1" && pwd)
out=$2
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
for f in "$src"/suites/*.yaml; do
  name=$(basename "$f" .yaml)
  case "$name" in gpu|checkpointing-full|chunking-long) continue ;; esac
  suite=$f
  if [ "$name" = imported ]; then
    suite="$out/imported.yaml"
    sed "s#build/models/#$build/models/#g" "$f" >"$suite"
  fi
  start=$SECONDS
  (cd "$src" && "$build/stratbench" run "$suite" --out "$out/$name" --repetitions 1 \
    --min-time 0.0001 >"$out/$name.log" 2>&1)
  echo "$name: exit $? in $((SECONDS - start)) s ($(tail -1 "$out/$name.log"))"
done
