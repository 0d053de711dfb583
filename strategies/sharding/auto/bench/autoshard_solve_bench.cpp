// Auto-sharding's solve time: building the model of a GPT-2-style graph (candidates priced,
// redistribution costs), the integer program over its node classes, and CBC's solve, for 2, 12
// and 48 layers on 2x2 and 2x4 meshes (the default bandwidth model). Repeated blocks share
// their choices, so the program is the same size for every depth; what grows is pricing the
// graph's edges and memory rows. Counters: CBC's own seconds and the program's size.
//
//   build/strategies/autoshard_solve_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include "reference/graph.h"
#include "strategies/sharding/auto/model.h"

namespace {

using namespace sb::strategies::autoshard;

void BM_SolveGpt2(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const std::vector<int64_t> mesh = {2, state.range(1)};
  const auto graph = sb::reference::buildGraph("gpt2", {{"layers", layers}});
  double cbc = 0;
  ShardingPlan plan;
  for (auto _ : state) {
    const ShardingModel m(graph, mesh, CostOptions{});
    plan = solvePlan(m, SolveOptions{});
    cbc += plan.solver.seconds;
  }
  state.counters["cbc_s"] = benchmark::Counter(cbc, benchmark::Counter::kAvgIterations);
  state.counters["classes"] = plan.solver.classes;
  state.counters["columns"] = plan.solver.variables;
  state.counters["rows"] = plan.solver.constraints;
  state.counters["nodes"] = static_cast<double>(graph.nodes.size());
}
BENCHMARK(BM_SolveGpt2)
    ->ArgsProduct({{2, 12, 48}, {2, 4}})
    ->ArgNames({"layers", "mesh_2x"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
