#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sb::harness {

// Per-repetition step times and their summary, in microseconds.
struct TimingStats {
  std::vector<double> samplesUs;  // one per repetition: mean step time of that repetition
  double medianUs = 0;
  double meanUs = 0;
  double stddevUs = 0;  // sample standard deviation (n - 1)
  double minUs = 0;
  double maxUs = 0;
  int64_t iterations = 0;  // steps per repetition

  static TimingStats fromSamples(std::vector<double> samplesUs, int64_t iterations);
  double cv() const { return meanUs > 0 ? stddevUs / meanUs : 0; }
};

// Times `step` with Google Benchmark: one benchmark registered at run time under `name`,
// manual time (`step` returns the seconds to charge: the slowest rank's), `repetitions`
// repetitions of at least `minTimeSec` each after `warmupSec` of untimed warm-up.
// Not reentrant: Google Benchmark's registry is process-global.
TimingStats timeWithBenchmark(const std::string& name, int repetitions, double minTimeSec,
                              double warmupSec, const std::function<double()>& step);

}  // namespace sb::harness
