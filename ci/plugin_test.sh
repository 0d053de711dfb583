#!/usr/bin/env bash
# End-to-end checks of stratbench as an installed package with out-of-tree strategies:
# `cmake --install` into a temporary prefix; examples/my_strategy built against it with
# nothing but find_package(stratbench); its suite run through --plugin (threads, gloo and
# STRATBENCH_PLUGIN_PATH) and passing; its planted fault failing; and the plugins stratbench
# must refuse (missing file, not a library, no `stratbench_plugin` symbol, another API or
# LibTorch version, a duplicate strategy id) refused with exit 2, a message naming the file,
# and no results written.
# Usage: ci/plugin_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
source "$src/ci/test_lib.sh"

prefix="$tmp/prefix"
sb="$prefix/bin/stratbench"

# 1. Install, and what is (and is not) installed.
check "cmake --install into a temporary prefix" 0 "" -- cmake --install "$build" --prefix "$prefix"
check "installed: binaries, libraries, API headers, CMake package" 0 "" -- bash -c "
  set -e
  for f in bin/stratbench bin/stratbench-core lib/libstratbench_harness.so \
           lib/libstratbench_reference.so lib/libstratbench_kernels.so lib/libstratbench_layout.so \
           include/stratbench/harness/strategy.h include/stratbench/harness/registry.h \
           include/stratbench/harness/plugin.h include/stratbench/harness/comm/rank_context.h \
           include/stratbench/harness/comm/comm.h include/stratbench/harness/box.h \
           include/stratbench/strategies/sharding/layout/placement.h \
           include/stratbench/reference/workload.h share/stratbench/plots/make_plots.py \
           lib/cmake/stratbench/stratbenchConfig.cmake \
           lib/cmake/stratbench/stratbenchConfigVersion.cmake; do
    test -e '$prefix/'\$f || { echo missing \$f; exit 1; }
  done
  for f in harness/run/runner.h harness/comm/threads_backend.h strategies/sharding/ops \
           strategies/sharding/layout/redistribute.h; do
    test ! -e '$prefix/include/stratbench/'\$f || { echo internal \$f installed; exit 1; }
  done"
# Every header docs/write-a-strategy.md names for a plugin (above its last section, which is
# about adding an operator inside the tree) is installed.
check "every header the plugin page names is installed" 0 "" -- python3 - "$src/docs/write-a-strategy.md" \
  "$prefix/include/stratbench" <<'PY'
import os, re, sys
text = open(sys.argv[1]).read()
text = text[:text.rfind("\n## ")]
named = set(re.findall(r"\b((?:harness|reference|strategies)/[\w/]+\.h)\b", text))
missing = sorted(h for h in named if not os.path.exists(os.path.join(sys.argv[2], h)))
assert named and not missing, f"named but not installed: {missing}"
PY
# The installed headers are a closed set: together they compile with nothing but LibTorch's and
# nlohmann_json's headers beside them (no internal header is missing).
check "installed headers compile from the prefix alone" 0 "" -- bash -c "
  set -e
  cd '$prefix/include/stratbench'
  find . -name '*.h' | sort | sed 's|^./|#include \"|; s|$|\"|' > '$tmp/all.cpp'
  g++ -std=c++17 -fsyntax-only -I'$prefix/include/stratbench' \
    -isystem /usr/include/torch/csrc/api/include '$tmp/all.cpp'"
check "the installed command runs from its prefix (its own libraries)" 0 \
  "libstratbench_harness.so => $prefix/bin/../lib/libstratbench_harness.so" -- bash -c \
  "'$sb' --version && ldd '$prefix/bin/stratbench-core' | grep stratbench_harness"

# 2. The example, built in its own folder against the installed package only.
check "examples/my_strategy configures with find_package(stratbench)" 0 "" -- \
  cmake -S "$src/examples/my_strategy" -B "$tmp/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}"
check "examples/my_strategy builds" 0 "" -- cmake --build "$tmp/example"
plugin="$tmp/example/libmy_strategy.so"

# 3. Loaded and run.
check "list --plugin shows the plugin's strategy and where it came from" 0 \
  "mine/linear/uneven_colwise .*\[plugin $plugin\]" -- "$sb" list --plugin "$plugin" --filter mine
check "list --json gives the origin" 0 "\"origin\": \"$plugin\"" -- \
  "$sb" list --plugin "$plugin" --filter mine --json
check "the example suite passes on threads through --plugin" 0 "total +4 +0 +0 +0" -- \
  "$sb" run "$src/examples/my_strategy/suite.yaml" --plugin "$plugin" --out "$tmp/threads"
check "threads rows: pass, counted communication as predicted" 0 "rows" -- \
  verify_rows "$tmp/threads/results.csv" 0.05
check "STRATBENCH_PLUGIN_PATH (a folder) loads it too" 0 "total +4 +0 +0 +0" -- \
  env STRATBENCH_PLUGIN_PATH="$tmp/example" \
  "$sb" run "$src/examples/my_strategy/suite.yaml" --out "$tmp/env" --repetitions 1
check "the planted fault fails (the unreduced input gradient)" 1 \
  "fail: .*grad_input" -- \
  "$sb" run "$src/examples/my_strategy/suite.yaml" --plugin "$plugin" --out "$tmp/fault" \
  --repetitions 1 --filter '^mine/' \
  --plant-fault 'mine/linear/uneven_colwise=skip_grad_input_all_reduce'
# On gloo, the suite's case on 3 ranks.
python3 - "$src/examples/my_strategy/suite.yaml" "$tmp/mesh3.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, cases = text.split("\ncases:\n")
keep = [c for c in cases.split("\n  - name: ") if "mesh: 3" in c]
open(sys.argv[2], "w").write(head + "\ncases:\n  - name: " + keep[0].rstrip() + "\n")
PY
if "$sb" run --help | grep -q gloo; then
  check "gloo, 3 processes, every rank loads the plugin" 0 "3 ranks on gloo" -- \
    "$sb" launch -n 3 -- run "$tmp/mesh3.yaml" --backend gloo \
    --plugin "$plugin" --out "$tmp/gloo" --repetitions 1 --filter '^mine/' --world-size 3
  check "gloo rows pass, comm exact" 0 "rows" -- verify_rows "$tmp/gloo/results.csv" 0.05
else
  echo "SKIP: this build has no gloo backend"
fi

# The same example against the build tree, not installed (CMAKE_PREFIX_PATH=BUILD: its command,
# its libraries, the checkout's headers), loaded by the build's own command.
check "examples/my_strategy configures against the build tree" 0 "" -- \
  cmake -S "$src/examples/my_strategy" -B "$tmp/example-tree" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$build${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}"
check "... and builds" 0 "" -- cmake --build "$tmp/example-tree"
check "the build's command loads it and runs its suite" 0 "total +4 +0 +0 +0" -- \
  "$build/stratbench" run "$src/examples/my_strategy/suite.yaml" \
  --plugin "$tmp/example-tree/libmy_strategy.so" --out "$tmp/tree" --repetitions 1

# 4. Plugins refused: exit 2, the file named, nothing written.
refused() {
  local name=$1 pattern=$2
  shift 2
  check "refused: $name" 2 "$pattern" -- "$sb" run "$src/examples/my_strategy/suite.yaml" \
    --out "$tmp/refused" "$@"
  if [ -e "$tmp/refused" ]; then fail "refused: $name: $tmp/refused was written"; fi
}
refused "a missing file" "plugin '$tmp/nope.so': no such file" --plugin "$tmp/nope.so"
echo "not a library" > "$tmp/libtext.so"
refused "a file that is not a library" "cannot load plugin '$tmp/libtext.so'" \
  --plugin "$tmp/libtext.so"
printf 'int answer(void) { return 42; }\n' > "$tmp/nosym.c"
cc -shared -fPIC -o "$tmp/libnosym.so" "$tmp/nosym.c"
refused "a library without the registration symbol" \
  "libnosym.so' is not a stratbench plugin: it has no .stratbench_plugin. symbol" \
  --plugin "$tmp/libnosym.so"
fake_plugin() {  # NAME API_VERSION TORCH_VERSION: a C library with only `stratbench_plugin`
  cat > "$tmp/$1.c" <<C
struct info { int api; const char* name; const char* torch; const char* cc; };
static const struct info i = {$2, "$1", "$3", "cc"};
const struct info* stratbench_plugin(void) { return &i; }
C
  cc -shared -fPIC -o "$tmp/lib$1.so" "$tmp/$1.c"
}
torch_version=$("$sb" --version | sed -n 's/.*LibTorch \([^)]*\)).*/\1/p')
fake_plugin future 999 "$torch_version"
refused "another plugin API version" \
  "libfuture.so' was built against stratbench plugin API version 999; this stratbench has version [0-9]+" \
  --plugin "$tmp/libfuture.so"
# This API version (it is the LibTorch version that differs).
api=$(sed -n 's/^#define SB_PLUGIN_API_VERSION \([0-9]*\)$/\1/p' "$src/harness/plugin.h")
fake_plugin oldtorch "$api" "0.0.1"
refused "another LibTorch version" "liboldtorch.so' was built against LibTorch 0.0.1" \
  --plugin "$tmp/liboldtorch.so"
cp "$plugin" "$tmp/libmy_strategy_copy.so"
refused "a duplicate strategy id" \
  "libmy_strategy_copy.so' refused: strategy id 'mine/linear/uneven_colwise' is already registered \($plugin\)" \
  --plugin "$plugin" --plugin "$tmp/libmy_strategy_copy.so"
check "refused: a folder given to --plugin" 2 "is a folder" -- \
  "$sb" list --plugin "$tmp/example"
check "refused: STRATBENCH_PLUGIN_PATH naming nothing" 2 "STRATBENCH_PLUGIN_PATH: '$tmp/gone'" -- \
  env STRATBENCH_PLUGIN_PATH="$tmp/gone" "$sb" list
check "the same file twice loads once" 0 "1 strategies" -- \
  "$sb" list --plugin "$plugin" --plugin "$plugin" --filter '^mine/'

finish
