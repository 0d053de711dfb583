#!/usr/bin/env bash
# The manual checked against itself and the code (issue 62; ci/docs_check.py): every page
# reachable from docs/index.md and the README, every relative link and anchor resolving,
# docs/workloads.md listing exactly the workloads and shape keys the binary knows. Then the
# check is shown to fail: a broken anchor, a page no list links, a workload key left out and
# a workload the code does not know are each named. Every shell block marked as run by this test
# runs (from a folder that looks like the checkout, build/ being BUILD), and so does the README's
# ./run.sh, the first command a newcomer types. Usage: ci/docs_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$(cd "$2" && pwd)
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

check "the manual: links, anchors, reachability, workloads and their keys" 0 "docs: 0 problem" -- \
  python3 "$src/ci/docs_check.py" "$src" "$sb"
# Planted: a copy of the manual with four mistakes.
# (The code the pages link to stays where it is: linked into the copy.)
mkdir -p "$tmp/m" && cp -r "$src/README.md" "$src/docs" "$tmp/m/"
for entry in "$src"/*; do
  [ -e "$tmp/m/$(basename "$entry")" ] || ln -s "$entry" "$tmp/m/$(basename "$entry")"
done
sed -i 's|(moe.md)|(moe.md#no-such-heading)|' "$tmp/m/docs/index.md"
echo "# Orphan" > "$tmp/m/docs/orphan.md"
python3 - "$tmp/m/docs/workloads.md" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
# The moe table's `aux_coef` row dropped; a workload the code does not know added.
s = re.sub(r"^\| `aux_coef` \|.*\n", "", s, count=1, flags=re.M)
s += "\n## `no_such_workload`\n\n| key | meaning | default |\n|---|---|---|\n| `x` | x | 1 |\n"
open(p, "w").write(s)
PY
check "planted mistakes: each named" 1 "docs: 5 problem" -- python3 "$src/ci/docs_check.py" "$tmp/m" "$sb"
for want in "no heading makes #no-such-heading" "docs/index.md does not link docs/orphan.md" \
            "README.md does not link docs/orphan.md" "workload 'moe': keys" \
            "documents 'no_such_workload'"; do
  grep -qF "$want" "$tmp/out" && pass "named: $want" || fail "not named: $want"
done
# Planted: a page with a shell block that does not say whether a test runs it.
mkdir -p "$tmp/m2/docs" && cp "$src/README.md" "$tmp/m2/" && cp -r "$src/docs/." "$tmp/m2/docs/"
printf '# Run\n\nText.\n\n```sh\nls\n```\n' > "$tmp/m2/docs/run.md"
check "a shell block that says nothing about being run is named" 1 \
  "docs/run.md:5: a shell block that does not say" -- python3 "$src/ci/docs_check.py" "$tmp/m2"

# The blocks marked as run, and the README's ./run.sh (its smoke suite and report; exit 0).
mkdir -p "$tmp/work"
check "every shell block marked as run exits 0" 0 "docs: [1-9][0-9]* block\(s\) run, 0 failed" -- \
  python3 "$src/ci/docs_check.py" "$src" --run "$build" "$tmp/work"
# Planted: a block marked as run that fails is named with its exit code.
mkdir -p "$tmp/m3/docs" "$tmp/work3" && echo "# R" > "$tmp/m3/README.md"
printf '# One\n\n<!-- runs in ci/docs_test.sh -->\n```sh\necho planted; exit 3\n```\n' \
  > "$tmp/m3/docs/one.md"
check "a block marked as run that fails is named" 1 "docs/one.md:4: exit 3" -- \
  python3 "$src/ci/docs_check.py" "$tmp/m3" --run "$build" "$tmp/work3"
check "./run.sh: the smoke suite and its report" 0 "report.html" -- "$tmp/work/run.sh"
[ -s "$tmp/work/out/latest/report.html" ] && [ -s "$tmp/work/out/latest/results.csv" ] &&
  pass "./run.sh left out/latest/report.html and results.csv" || fail "./run.sh left no report"
finish
