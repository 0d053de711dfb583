// libFuzzer target: the pipeline schedule reader (strategies/pipeline/schedule.h:
// readScheduleCsv, `solve pipeline --csv`) and the dry run of what it accepts. Any text is a
// schedule or a ScheduleError naming the file and cell; a schedule it accepts is complete (every
// stage's every micro-batch forward and backward once, on its stage's rank) and its dry run
// either finishes with every action timed after what it needs, or names a waiting rank.

#include <cmath>
#include <cstdint>
#include <string>

#include "strategies/pipeline/schedule.h"

namespace pp = sb::strategies::pipeline;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pp::Schedule s;
  try {
    s = pp::readScheduleCsv(text, "fuzz.csv");
  } catch (const pp::ScheduleError&) {
    return 0;
  }
  if (s.ranks < 1 || s.stages < 1 || s.microbatches < 1) __builtin_trap();
  if (static_cast<int>(s.stageRank.size()) != s.stages) __builtin_trap();
  // Small enough to run: the dry run of what was accepted.
  int64_t actions = 0;
  for (const auto& row : s.perRank) actions += static_cast<int64_t>(row.size());
  if (actions != static_cast<int64_t>(s.stages) * s.microbatches * (s.splitBackward ? 3 : 2) &&
      !s.splitBackward) {
    __builtin_trap();  // every forward and full backward once
  }
  pp::Costs costs;
  costs.stages = {pp::StageCost{}};
  const pp::Simulation sim = pp::simulate(s, costs);
  if (sim.deadlock.empty()) {
    size_t timed = 0;
    for (const auto& t : sim.ranks) timed += t.actions.size();
    if (static_cast<int64_t>(timed) != actions) __builtin_trap();
    if (!(sim.bubbleFraction >= 0 && sim.bubbleFraction < 1)) __builtin_trap();
    // Every rank on one core: the same actions in time order, the core never idle while one
    // is ready, so the step is every action's cost summed.
    if (s.ranks > 1 && actions * s.ranks <= 1000000) {
      costs.sharing.cores = 1;
      const pp::Simulation one = pp::simulate(s, costs);
      double work = 0;
      size_t ran = 0;
      for (const auto& t : one.ranks) {
        work += t.busyUs;
        ran += t.actions.size();
      }
      if (static_cast<int64_t>(ran) != actions || !one.coresShared) __builtin_trap();
      if (std::abs(one.stepUs - work) > 1e-6 * work) __builtin_trap();
    }
  } else if (sim.waiting.empty()) {
    __builtin_trap();
  }
  (void)pp::simulationJson(s, sim);
  return 0;
}
