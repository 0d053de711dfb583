// How long importing a traced model takes (reference/torchscript/import.h), against LibTorch's
// own torch::jit::load of the same file in the same run: the 12-layer GPT-2-style model and
// torchvision's DenseNet-121 (and ResNet-18), as reference/models/trace_models.py writes them.
//
//   BM_JitLoad/NAME   torch::jit::load alone
//   BM_Import/NAME    the whole import, uncached: load, the control-flow scan, the walk that
//                     executes every node once and maps it; counters load_ms and walk_ms split
//                     each iteration, import_over_load is their sum over the load, per iteration
//
//   /usr/bin/python3 reference/models/trace_models.py --out build/models
//   build/reference/import_bench --benchmark_counters_tabular=true [--models DIR]

#include <benchmark/benchmark.h>

#include <torch/csrc/jit/serialization/import.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "reference/torchscript/import.h"

namespace {

namespace ts = sb::reference::torchscript;

void jitLoad(benchmark::State& state, const std::string& file) {
  for (auto _ : state) {
    torch::jit::Module m = torch::jit::load(file);
    benchmark::DoNotOptimize(m);
  }
}

void import(benchmark::State& state, const ts::ImportSpec& spec) {
  double load = 0, walk = 0, ratio = 0;
  for (auto _ : state) {
    const auto m = ts::importModelUncached(spec);
    load += m->loadSeconds;
    walk += m->importSeconds;
    ratio += (m->loadSeconds + m->importSeconds) / m->loadSeconds;
    benchmark::DoNotOptimize(m);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["load_ms"] = 1e3 * load / n;
  state.counters["walk_ms"] = 1e3 * walk / n;
  state.counters["import_over_load"] = ratio / n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir =
      std::getenv("STRATBENCH_MODELS") ? std::getenv("STRATBENCH_MODELS") : "build/models";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--models") dir = argv[i + 1];
  }
  int registered = 0;
  for (const std::string name : {"gpt2_12", "densenet121", "resnet18"}) {
    std::ifstream in(dir + "/" + name + ".json");
    if (!in) continue;
    const nlohmann::json meta = nlohmann::json::parse(in);
    const nlohmann::json shape = {{"file", dir + "/" + meta.at("file").get<std::string>()},
                                  {"inputs", meta.at("inputs")}};
    const ts::ImportSpec spec = ts::ImportSpec::fromJson(shape);
    benchmark::RegisterBenchmark(("BM_JitLoad/" + name).c_str(), jitLoad, spec.file)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Import/" + name).c_str(), import, spec)
        ->Unit(benchmark::kMillisecond);
    ++registered;
  }
  if (registered == 0) {
    std::cerr << "import_bench: no traced models in " << dir
              << " (run /usr/bin/python3 reference/models/trace_models.py --out " << dir
              << ", or pass --models DIR)\n";
    return 2;
  }
  // --models is ours; Google Benchmark refuses flags it does not know.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--models") {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
