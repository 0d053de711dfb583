#!/usr/bin/env bash
# The manual checked against itself and the code (issue 62; ci/docs_check.py): every page
# reachable from docs/index.md and the README, every relative link and anchor resolving,
# docs/workloads.md listing exactly the workloads and shape keys the binary knows. Then the
# check is shown to fail: a broken anchor, a page no list links, a workload key left out and
# a workload the code does not know are each named. Usage: ci/docs_test.sh BUILD SOURCE
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
finish
