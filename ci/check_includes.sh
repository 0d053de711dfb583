#!/usr/bin/env bash
# The house's include direction: every room includes only rooms below it.
#
#   cli/          may include anything
#   reports/      harness/, reference/, kernels/ (reads result files; runs no strategy)
#   strategies/   harness/, reference/, kernels/
#     sharding/layout/   of strategies/ only itself (its own library, under every executor)
#   harness/      reference/, kernels/
#   reference/    kernels/ at most;  kernels/  nothing of ours
#
# Tests and benchmarks inside a room obey the room's rule. Prints each offending line as
# FILE:LINE: #include "..." (ROOM may not include ...) and exits 1 if there is one, 0 if none.
#
#   ci/check_includes.sh [ROOT]       # ROOT defaults to the checkout
#   ci/check_includes.sh --self-test  # a planted upward include in a copy must be caught
set -euo pipefail

if [ "${1:-}" = "--self-test" ]; then
  src=$(cd "$(dirname "$0")/.." && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp -r "$src/harness" "$src/strategies" "$src/reference" "$src/kernels" "$src/reports" "$tmp/"
  "$0" "$tmp" > /dev/null || { echo "self-test: the clean copy already fails"; exit 1; }
  printf '#include "strategies/sharding/ops/op_strategies.h"\n' >> "$tmp/harness/box.h"
  out=$("$0" "$tmp" 2>&1) && { echo "self-test: a planted strategies/ include in harness/ passed"; exit 1; }
  grep -q 'harness/box.h:.*strategies/sharding/ops/op_strategies.h' <<< "$out" ||
    { echo "self-test: the planted include is not named: $out"; exit 1; }
  sed -i '$d' "$tmp/harness/box.h"
  printf '#include "strategies/sharding/auto/model.h"\n' >> "$tmp/strategies/sharding/layout/placement.h"
  "$0" "$tmp" > /dev/null 2>&1 && { echo "self-test: layout/ including auto/ passed"; exit 1; }
  echo "self-test: planted upward includes are caught"
  exit 0
fi

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
bad=0
# check ROOM ALLOWED_REGEX [EXCLUDED_SUBDIR]
check() {
  local room=$1 allowed=$2 exclude=${3:-}
  [ -d "$room" ] || return 0
  local hits
  hits=$(grep -rnE --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
           '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' "$room" || true)
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    local file=${line%%:*}
    [ -n "$exclude" ] && [[ "$file" == "$exclude"/* ]] && continue
    local inc
    inc=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<< "$line")
    if ! [[ "$inc" =~ $allowed ]]; then
      echo "$line  ($room may include only ${allowed//|/, })"
      bad=1
    fi
  done <<< "$hits"
}
check kernels '^kernels/'
check reference '^(reference|kernels)/'
check harness '^(harness|reference|kernels)/'
check strategies/sharding/layout '^(strategies/sharding/layout|harness|reference|kernels)/'
check strategies '^(strategies|harness|reference|kernels)/' strategies/sharding/layout
check reports '^(reports|harness|reference|kernels)/'
exit $bad
