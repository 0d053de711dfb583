#include "harness/measure/timing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <benchmark/benchmark.h>
#include <c10/util/Exception.h>

namespace sb::harness {
namespace {

// Collects the per-repetition runs and prints nothing: the runner prints its own progress.
class CollectingReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration) continue;
      if (run.error_occurred) error = run.error_message;
      // With manual time, the adjusted real time is the mean manual time per iteration, in
      // the benchmark's time unit (microseconds here).
      samplesUs.push_back(run.GetAdjustedRealTime());
      iterations = run.iterations;
    }
  }
  std::vector<double> samplesUs;
  int64_t iterations = 0;
  std::string error;
};

}  // namespace

TimingStats TimingStats::fromSamples(std::vector<double> samplesUs, int64_t iterations) {
  TimingStats t;
  t.iterations = iterations;
  t.samplesUs = samplesUs;
  if (samplesUs.empty()) return t;
  std::vector<double> sorted = samplesUs;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  t.medianUs = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  t.meanUs = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  double ss = 0;
  for (double x : sorted) ss += (x - t.meanUs) * (x - t.meanUs);
  t.stddevUs = n > 1 ? std::sqrt(ss / (n - 1)) : 0;
  t.minUs = sorted.front();
  t.maxUs = sorted.back();
  return t;
}

TimingStats timeWithBenchmark(const std::string& name, int repetitions, double minTimeSec,
                              double warmupSec, const std::function<double()>& step) {
  TORCH_CHECK(repetitions >= 1, "repetitions must be at least 1, got ", repetitions);
  std::string failure;
  auto* bench = benchmark::RegisterBenchmark(name.c_str(), [&](benchmark::State& state) {
    for (auto _ : state) {
      // Google Benchmark runs the remaining repetitions after an error: no more steps, whose
      // collectives would wait on ranks that have already given up.
      if (!failure.empty()) {
        state.SkipWithError("step failed");
        break;
      }
      try {
        state.SetIterationTime(step());
      } catch (const std::exception& e) {
        failure = e.what();
        state.SkipWithError("step failed");
        break;
      }
    }
  });
  bench->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Repetitions(repetitions)
      ->MinTime(minTimeSec)
      ->MinWarmUpTime(warmupSec);
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter, ".*");
  benchmark::ClearRegisteredBenchmarks();
  TORCH_CHECK(failure.empty(), "timed step failed: ", failure);
  TORCH_CHECK(reporter.error.empty(), "benchmark error: ", reporter.error);
  TORCH_CHECK(!reporter.samplesUs.empty(), "Google Benchmark reported no runs for ", name);
  return TimingStats::fromSamples(reporter.samplesUs, reporter.iterations);
}

}  // namespace sb::harness
