// The degree search of composed parallelism (`solve parallel`, parallel_search.h): a
// LLaMA-3-8B-shaped graph (32 layers, d_model 4096, 32 heads on 8 key and value heads, FFN
// 14336, vocabulary 128256, sequence 8192, bf16) on 64 and 512 ranks (a batch of as many
// sequences), 8 ranks a node, under 80 GB a rank: every assignment of the ranks to pp x
// dp_replicate x dp_shard x cp x tp with the schedules, micro-batch counts, sp and checkpointing,
// each priced (the pipeline's dry run included) and ranked. Nothing is allocated. BM_Summary is
// the graph's summary alone (built once per search). Counters: configurations priced, and
// those that fit.
//
//   build/strategies/parallel_search_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include "reference/graph.h"
#include "strategies/sharding/compose/parallel_graph.h"

namespace {

using namespace sb::strategies::compose;

nlohmann::json llama3(int64_t batch) {
  return {{"batch", batch},  {"seq", 8192},  {"d_model", 4096}, {"heads", 32},
          {"kv_heads", 8},   {"ffn", 14336}, {"vocab", 128256}, {"layers", 32}};
}

SearchOptions options(int ranks) {
  SearchOptions o;
  o.ranks = ranks;
  o.memoryLimit = 80e9;
  o.prices.ranksPerNode = 8;
  o.prices.gflops = 400000;
  o.prices.copyGBps = 2000;
  o.prices.intraGBps = 200;
  o.prices.interGBps = 25;
  return o;
}

void BM_Summary(benchmark::State& state) {
  for (auto _ : state) {
    const ModelCosts m = modelCosts(sb::reference::buildGraph("llama", llama3(state.range(0))), 2);
    benchmark::DoNotOptimize(m.units.data());
  }
}
BENCHMARK(BM_Summary)->Arg(64)->ArgName("batch")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SearchLlama8B(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const ModelCosts m = modelCosts(sb::reference::buildGraph("llama", llama3(ranks)), 2);
  const SearchOptions o = options(ranks);
  SearchResult r;
  for (auto _ : state) {
    r = search(m, o);
    benchmark::DoNotOptimize(r.ranked.data());
  }
  state.counters["configurations"] = static_cast<double>(r.configurations);
  state.counters["fitting"] = static_cast<double>(r.fitting);
}
BENCHMARK(BM_SearchLlama8B)
    ->Arg(64)
    ->Arg(512)
    ->ArgName("ranks")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
