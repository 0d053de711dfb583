// Auto-sharding's solve time: building the model of a GPT-2-style graph (candidates priced,
// redistribution costs), the integer program over its node classes, and CBC's solve, for 2, 12
// and 48 layers on 2x2 and 2x4 meshes (the default bandwidth model). Repeated blocks share
// their choices, so the program is the same size for every depth; what grows is pricing the
// graph's edges and memory rows. Counters: CBC's own seconds and the program's size.
//
// BM_SolveLlama8B: a LLaMA-3-8B-shaped graph (d_model 4096, 32 heads on 8 key and value heads,
// FFN 14336, vocabulary 128256, sequence 8192, batch 8) of 2, 12 and 32 layers on an 8x8 mesh,
// without a memory limit and under one that binds (70 GB a rank: the unconstrained plan needs
// 73.6 GB), and of 32 layers on a 4x4x4 mesh (mesh_3d) without a limit and under 66 GB (its
// unconstrained plan needs 70.4 GB), CBC stopped at a 0.1% gap, in the same run. Nothing is
// allocated: the model, the program, CBC and the replay of the plan's step. Counters: CBC's
// seconds, the replay's, the rounds of solving, the optimality gap (from CBC's bound) and the
// plan's peak a rank.
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

void BM_SolveLlama8B(benchmark::State& state) {
  const nlohmann::json shape = {
      {"batch", 8},    {"seq", 8192},  {"d_model", 4096}, {"heads", 32},
      {"kv_heads", 8}, {"ffn", 14336}, {"vocab", 128256}, {"layers", state.range(0)}};
  const auto graph = sb::reference::buildGraph("llama", shape);
  SolveOptions o;
  o.memoryLimit = static_cast<double>(state.range(1)) * 1e9;
  const bool threeD = state.range(2) != 0;
  if (threeD) o.relativeGap = 1e-3;
  const std::vector<int64_t> mesh =
      threeD ? std::vector<int64_t>{4, 4, 4} : std::vector<int64_t>{8, 8};
  double cbc = 0, replay = 0;
  ShardingPlan plan;
  for (auto _ : state) {
    const ShardingModel m(graph, mesh, CostOptions{});
    plan = solvePlan(m, o);
    cbc += plan.solver.seconds;
    replay += plan.solver.replaySeconds;
  }
  state.counters["cbc_s"] = benchmark::Counter(cbc, benchmark::Counter::kAvgIterations);
  state.counters["replay_s"] = benchmark::Counter(replay, benchmark::Counter::kAvgIterations);
  state.counters["rounds"] = plan.solver.rounds;
  state.counters["gap"] = plan.solver.gap;
  state.counters["peak_GB"] = static_cast<double>(plan.predictedPeakBytes) / 1e9;
  state.counters["classes"] = plan.solver.classes;
}
// Layers 2 and 12 under no limit (a limit scaled for 32 layers would not bind them).
BENCHMARK(BM_SolveLlama8B)
    ->Args({2, 0, 0})
    ->Args({12, 0, 0})
    ->Args({32, 0, 0})
    ->Args({32, 70, 0})
    ->Args({32, 0, 1})
    ->Args({32, 66, 1})
    ->ArgNames({"layers", "limit_GB", "mesh_3d"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
