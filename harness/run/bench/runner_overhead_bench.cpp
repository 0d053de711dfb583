// What the runner costs: the same replicated Linear forward + backward, once raw in LibTorch
// and once through the runner's timed step on a one-rank mesh (executor "RR = RR x RR":
// gradient reset, dispatch to the rank, per-rank timing). Both are timed as whole iterations
// (real time), so the ratio runner / raw is the runner's overhead on a step of this size.
//
//   build/harness/runner_overhead_bench --benchmark_repetitions=9
//       --benchmark_report_aggregates_only=true

#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/threads_backend.h"
#include "harness/measure/memory.h"
#include "harness/registry.h"
#include "harness/run/runner.h"

namespace {

using namespace sb;

harness::CaseSpec benchCase(int64_t rows, int64_t features) {
  harness::CaseSpec c;
  c.suite = "bench";
  c.name = "runner-overhead";
  c.workload = "linear";
  c.shape = {{"input", {rows, features}}, {"out_features", features}, {"bias", true}};
  c.mesh = {1};
  c.seed = 1;
  return c;
}

void BM_RawLibTorch(benchmark::State& state) {
  const auto c = benchCase(state.range(0), state.range(1));
  const auto data = reference::findWorkload("linear")->build(c.shape, c.dtype, c.seed, c.inputs);
  at::Tensor x = data.inputs.at("input").clone().set_requires_grad(true);
  at::Tensor w = data.inputs.at("weight").clone().set_requires_grad(true);
  at::Tensor b = data.inputs.at("bias").clone().set_requires_grad(true);
  const at::Tensor gy = data.inputs.at("grad_output");
  for (auto _ : state) {
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    b.mutable_grad().reset();
    at::Tensor y = at::linear(x, w, b);
    torch::autograd::backward({y}, {gy});
    benchmark::DoNotOptimize(w.grad().data_ptr());
  }
}

void BM_Runner(benchmark::State& state) {
  const auto c = benchCase(state.range(0), state.range(1));
  const auto data = reference::findWorkload("linear")->build(c.shape, c.dtype, c.seed, c.inputs);
  const auto* strategy = harness::StrategyRegistry::global().find("sharding/linear/RR=RR.RR");
  harness::ThreadsWorld world{harness::DeviceMesh(c.mesh)};
  std::vector<std::unique_ptr<harness::RankExecutor>> execs(1);
  std::vector<double> scratch(1);
  world.run([&](harness::RankContext& ctx) {
    execs[0] = strategy->makeExecutor(c);
    execs[0]->prepare(ctx, data);
  });
  for (auto _ : state) benchmark::DoNotOptimize(harness::timedStep(world, execs, scratch));
}

}  // namespace

// Shapes: a small step (where fixed overhead shows most) and a mid-sized one.
BENCHMARK(BM_RawLibTorch)->Args({64, 256})->Args({256, 512})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Runner)->Args({64, 256})->Args({256, 512})->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  // The runner always runs with the tracking allocator installed: so does this benchmark, for
  // both sides, so that the ratio isolates the runner.
  harness::MemoryTracker::instance().install();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
