// libFuzzer target: the graph workloads' shape reader (reference/graph.h: buildGraph, `graph
// --shape`, `solve shard --shape` and a suite's shape of gpt2, bert and mlp), read through the
// strict JSON parser those commands use (reference/json_strict.h). Any text is a graph or
// std::invalid_argument / a JSON error naming the key; a graph it accepts has positive
// dimensions whose products stay far inside int64 (the planners sum byte counts of them).

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "reference/graph.h"
#include "reference/json_strict.h"

namespace {

// Each full shape positive, at most 2^48 elements (buildGraph's own bound, checked here from
// outside it).
void checkShape(const std::vector<int64_t>& dims) {
  long double elements = 1;
  for (int64_t d : dims) {
    if (d <= 0) __builtin_trap();
    elements *= static_cast<long double>(d);
  }
  if (elements > static_cast<long double>(int64_t{1} << 48)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the workload; the rest is the --shape text.
  const auto& workloads = sb::reference::graphWorkloads();
  const std::string workload = workloads[data[0] % workloads.size()];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  nlohmann::json shape;
  try {
    shape = sb::reference::parseJsonNoDuplicates(text);
  } catch (const nlohmann::json::exception&) {
    return 0;
  } catch (const std::invalid_argument&) {
    return 0;
  }
  try {
    const auto g = sb::reference::buildGraph(workload, shape);
    if (g.nodes.empty()) __builtin_trap();
    for (const auto& [name, dims] : g.inputs) checkShape(dims);
    for (const auto& [name, dims] : g.parameters) checkShape(dims);
    checkShape(g.valueShape(g.output));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
