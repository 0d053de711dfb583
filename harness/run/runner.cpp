// One row on threads: the phases of a row on this process's ranks (runLocal, which the
// multi-process row uses too), the timed step Google Benchmark repeats, and runStrategy, the row
// on the threads backend. The rest of the runner is beside it in harness/run/: planning
// (plan.cpp), verification (row_checks.cpp), predictions (predict.cpp), the record
// (compose.cpp), the multi-process row (distributed_row.cpp), the suite loop (suite_run.cpp)
// and its output (progress.cpp).

#include "harness/run/runner.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "harness/comm/comm_site.h"
#include "harness/comm/threads_backend.h"
#include "harness/comm/world.h"
#include "harness/measure/device.h"
#include "harness/measure/memory.h"
#include "harness/measure/step_trace.h"
#include "harness/run/compose.h"
#include "harness/run/divergence.h"
#include "harness/run/faults.h"
#include "harness/run/local_run.h"
#include "harness/run/plan.h"
#include "harness/run/predict.h"
#include "harness/run/records.h"
#include "harness/run/row_checks.h"
#include "harness/run/run_util.h"

namespace sb::harness {
namespace {

// `run --plant-slowdown ID=PCT`: the fraction the strategy's timed steps are slowed by (0: none).
double plantedSlowdown(const RunOptions& options, const std::string& id) {
  for (const auto& [sid, fraction] : options.plantedSlowdowns) {
    if (sid == id) return fraction;
  }
  return 0;
}

// Spins (busy, as the step's own compute would) until `secs` x (1 + fraction) have passed
// since the step began, and returns that time: the step made slower by `fraction`, for real.
double spinFor(double secs, double fraction) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(secs * fraction);
  while (std::chrono::steady_clock::now() < until) {
  }
  return secs * (1 + fraction);
}

// `run --trace DIR`: one more step, untimed, traced on every local rank; its files under
// DIR/<suite>/<case>/<strategy id>/ ('/' in a name as '+'): rank<R>.trace.json (Chrome trace
// events), rank<R>.memory.txt (SB_MEMORY_TRACE's lines), and all-ranks.trace.json where the process
// has more than one rank. A level that is a link or a file was refused before the run (planSuite);
// a file that cannot be written now is said on stderr and the row goes on.
void traceStep(World& world, const CaseSpec& c, const Strategy& strategy,
               std::vector<std::unique_ptr<RankExecutor>>& execs, const std::string& dir) {
  std::vector<StepTraceRecord> records(execs.size());
  world.run([&](RankContext& ctx) {
    beginStepTrace(ctx.rank());
    try {
      const TraceScope span("step", "step");
      execs[ctx.rank()]->step(ctx);
    } catch (...) {
      records[ctx.rank()] = endStepTrace();
      throw;
    }
    records[ctx.rank()] = endStepTrace();
  });
  const std::vector<std::string> levels = traceLevels(c, strategy.id());
  std::string folder = dir;
  for (const auto& l : levels) folder += "/" + l;
  const nlohmann::json about = {{"suite", c.suite},
                                {"case", c.name},
                                {"strategy_id", strategy.id()},
                                {"mesh", c.meshString()},
                                {"workload", c.workload}};
  std::vector<StepTraceRecord> mine;
  for (int r : world.localRanks()) mine.push_back(records[r]);
  try {
    // Each level made here; planSuite refused a link or a file at one before the run, and one
    // planted since is refused again here.
    std::filesystem::create_directories(dir);  // --trace itself (its folder must exist)
    std::string at = dir;
    for (const auto& l : levels) {
      at += "/" + l;
      if (const std::string why = traceLevelProblem(at); why == "not found") {
        std::filesystem::create_directory(at);
      } else if (!why.empty()) {
        throw std::runtime_error(at + why);
      }
    }
    // Written beside and renamed over the name: a symbolic link planted at it is replaced,
    // never written through (it overwrote the file the link named).
    const auto write = [&](const std::string& path, const std::string& text) {
      writeFileAtomic(path, text);
    };
    for (const auto& r : mine) {
      const std::string base = folder + "/rank" + std::to_string(r.rank);
      write(base + ".trace.json", traceEventFile({r}, about).dump());
      std::string lines;
      for (const auto& l : r.memoryLines) lines += l + "\n";
      write(base + ".memory.txt", lines);
    }
    if (mine.size() > 1)
      write(folder + "/all-ranks.trace.json", traceEventFile(mine, about).dump());
  } catch (const std::exception& e) {
    std::cerr << "stratbench: --trace: " << folder << ": " << e.what() << "\n";
  }
}

}  // namespace

std::vector<std::string> traceLevels(const CaseSpec& c, const std::string& strategyId) {
  // One folder level per name, whatever it holds ('/' in a swept case's name or an id), and
  // never one that leaves the level: a name of dots only ("..") has them spelled %2E. Two names
  // never share a folder ('%' and '+' are spelled %25 and %2B before '/' becomes '+': cases
  // "a/b" and "a+b" overwrote each other's traces).
  const auto level = [](const std::string& name) {
    std::string s;
    for (char ch : name) {
      if (ch == '%') {
        s += "%25";
      } else if (ch == '+') {
        s += "%2B";
      } else {
        s += ch == '/' ? '+' : ch;
      }
    }
    if (s.find_first_not_of('.') == std::string::npos) {
      std::string spelled;
      for (size_t i = 0; i < s.size(); ++i) spelled += "%2E";
      return spelled.empty() ? std::string("%00") : spelled;
    }
    return s;
  };
  return {level(c.suite), level(c.name), level(strategyId)};
}

std::string traceLevelProblem(const std::string& at) {
  // Each level under --trace made here and a folder of its own: a symbolic link planted at one
  // (DIR/<suite> -> elsewhere) would carry the traces out of the folder named, so it is refused,
  // never followed.
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(at, ec);
  if (st.type() == std::filesystem::file_type::not_found) return "not found";
  if (ec) return ": " + ec.message();
  if (st.type() == std::filesystem::file_type::symlink) {
    return " is a symbolic link: the traces are written only into folders under --trace, never "
           "through one (remove it)";
  }
  if (st.type() != std::filesystem::file_type::directory) return " is there and is not a folder";
  return "";
}

LocalRun runLocal(World& world, const CaseSpec& c, const reference::WorkloadData& data,
                  const Strategy& strategy, const RunOptions& options,
                  const std::function<void()>& onError) {
  const std::vector<int> local = world.localRanks();
  const int n = world.mesh().size();
  LocalRun out;
  std::vector<int> slot(n, -1);
  for (int r : local) {
    slot[r] = static_cast<int>(out.ranks.size());
    out.ranks.emplace_back(r);
  }
  std::vector<std::unique_ptr<RankExecutor>> execs(n);
  std::vector<double> stepSeconds(n, 0.0);
  std::vector<std::map<std::string, at::Tensor>> results(n);
  std::vector<int64_t> peak(n, 0), start(n, 0), end(n, -1);
  try {
    MemoryTracker::instance().install();
    std::mutex mu;
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      execs[r] = strategy.makeExecutor(c);
      // SB_MEMORY_TRACE: where a row begins (a model's replay printed in prepare is this row's).
      MemoryTracker::instance().traceNote(r, "prepare");
      try {
        execs[r]->prepare(ctx, data);
      } catch (const UnsupportedCase& e) {
        std::lock_guard<std::mutex> lock(mu);
        out.ranks[slot[r]].unsupported = e.what();
      }
    });
    const bool unsupported = std::any_of(out.ranks.begin(), out.ranks.end(),
                                         [](const auto& o) { return !o.unsupported.empty(); });
    if (world.anyOverProcesses(unsupported)) return out;

    // Warm-up: first-touch allocations and lazy initialisation stay out of the measurements.
    world.run([&](RankContext& ctx) { execs[ctx.rank()]->step(ctx); });

    // The measured step: communication counts, peak memory and the results to verify.
    liveStatus().phase = "measured step";
    world.resetStats();
    const std::string node = strategy.singleNode(c);
    const bool cuda = reference::caseDevice().is_cuda();
    DeviceMemoryStats before;
    const int64_t hookBefore = cudaAllocationsSeen();
    bool hookBlind = false;
    if (cuda) {
      resetDevicePeak();
      before = deviceMemoryStats();
    }
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      MemoryTracker::instance().resetPeak(r);
      start[r] = MemoryTracker::instance().current(r);
      maybeFireRankFault(options, r);
      if (OutOfProcessStep* other = execs[r]->outOfProcess()) other->measureNextStep();
      {
        // A one-node strategy's collectives are its node's (comm_site.h); a multi-node
        // executor names its own.
        const CommSiteScope site(node);
        execs[r]->step(ctx);
      }
      peak[r] = MemoryTracker::instance().peak(r);
      MemoryTracker::instance().traceNote(r, "end of the measured step");
    });
    // What the step left live, read once every rank of the mesh is past its step (a peer may
    // still hold a tensor of this rank's, as a collective's part, until it is).
    world.maxOverProcesses(0.0);
    for (int r : local) end[r] = MemoryTracker::instance().current(r);
    if (cuda) {
      // The rank peaks above are the allocation hook's: tensor bytes per rank, as on the CPU.
      // The allocator's own peak is the device's (every rank of this process on it), in its
      // rounded blocks; kept beside them.
      const DeviceMemoryStats after = deviceMemoryStats();
      const int64_t hookSaw = cudaAllocationsSeen() - hookBefore;
      out.deviceMemory = {
          {"allocated_peak_over_start_bytes", after.allocatedPeak - before.allocatedCurrent},
          {"reserved_peak_bytes", after.reservedPeak},
          {"allocations_seen_by_hook", hookSaw}};
      if (hookSaw == 0 && after.allocatedPeak > before.allocatedCurrent) {
        // The hook saw nothing while the allocator allocated: the per-rank peaks are unknown
        // (the allocator's own peak over the start is beside them), and so is what a step
        // leaves live (no leak check).
        out.deviceMemory["note"] =
            "the allocation hook saw no allocation of this step: per-rank peaks are not known";
        hookBlind = true;
        for (int r : local) end[r] = -1;
      }
    }
    for (int r : local) {
      out.ranks[slot[r]].counted = world.stats(r);
      out.ranks[slot[r]].wire = world.wireStats(r);
      // A step run by another process (a PyTorch rank) was measured there.
      if (const OutOfProcessStep* other = execs[r]->outOfProcess()) {
        const OutOfProcessMeasures m = other->measures();
        out.ranks[slot[r]].counted = m.comm;
        out.ranks[slot[r]].wire = m.comm;
        peak[r] = m.peakBytes;
        start[r] = m.startBytes;
        end[r] = -1;  // not read there: no leak check
      }
    }
    // Untimed and uncounted: results laid out as the strategy declares them (pending sums
    // reduced), then taken for verification; after the measured step and after the timing.
    const auto takeResults = [&] {
      world.run([&](RankContext& ctx) {
        execs[ctx.rank()]->settle(ctx);
        results[ctx.rank()] = execs[ctx.rank()]->results();
      });
    };
    takeResults();
    for (int r : local) {
      RankOutcome& o = out.ranks[slot[r]];
      o.checks = verifyRank(c, data, strategy, r, results[r]);
      o.digests = resultDigests(c, data, strategy, r, results[r]);
      o.peak = peak[r];
      o.startBytes = start[r];
      o.endBytes = end[r];
      o.predictedPeak = execs[r]->predictedPeakBytes();
      if (!o.predictedPeak) o.predictedPeak = strategy.predictPeakMemory(c, r);
      o.memoryLimit = execs[r]->memoryLimitBytes();
    }
    if (slot[0] >= 0) {
      out.predictedTimeUs = execs[0]->predictedTimeUs();
      out.params = execs[0]->recordParams();
      if (const double f = plantedSlowdown(options, strategy.id()); f > 0) {
        out.params.emplace_back("planted_slowdown_pct", std::to_string(f * 100));
      }
      out.executorDetails = execs[0]->details();
    }

    // Timing: the slowest rank's step time per iteration.
    liveStatus().phase = "timing";
    liveStatus().stepsTimed = 0;
    const double slowdown = plantedSlowdown(options, strategy.id());
    std::vector<LiveAfterSteps> liveAfter(n);
    out.timing =
        timeWithBenchmark(c.suite + "/" + c.name + "/" + strategy.id(), c.repetitions, c.minTimeSec,
                          options.warmupSec, [&] {
                            liveStatus().stepsTimed.fetch_add(1, std::memory_order_relaxed);
                            const double secs = timedStep(world, execs, stepSeconds, &liveAfter);
                            return slowdown > 0 ? spinFor(secs, slowdown) : secs;
                          });
    liveStatus().phase = "verifying the timed steps";
    for (int r : local) {
      // Each timed step runs after another step, with the runner holding the same results: a
      // step that leaves more live behind than the one before it leaks. Not checked: a step run
      // in another process (a PyTorch rank; its runner reports no such reading), a device
      // step the allocation hook did not see.
      if (execs[r]->outOfProcess() || hookBlind) continue;
      out.ranks[slot[r]].timedSteps = liveAfter[r].steps;
      out.ranks[slot[r]].afterFirstTimedBytes = liveAfter[r].first;
      out.ranks[slot[r]].afterLastTimedBytes = liveAfter[r].last;
    }

    // As nccl-tests does, the timed runs are verified too: the last timed step must still
    // give the reference results (catches state that leaks from step to step).
    takeResults();
    for (int r : local) {
      out.ranks[slot[r]].checksAfter = verifyRank(c, data, strategy, r, results[r]);
    }
    if (slot[0] >= 0 && execs[0]->detailsCoverTiming()) out.executorDetails = execs[0]->details();

    // A failing row is located: one more step with capture on (divergence.h). Decided alike on
    // every rank, so that the capture's collectives meet.
    bool failedHere = false;
    for (int r : local) {
      const RankOutcome& o = out.ranks[slot[r]];
      for (const auto* checks : {&o.checks, &o.checksAfter}) {
        for (const auto& ch : *checks) failedHere = failedHere || !ch.passed();
      }
    }
    bool worldUsable = true;
    if (execs[local.front()]->capturesValues() &&
        (world.anyOverProcesses(failedHere) || options.capture)) {
      liveStatus().phase = "locating the divergence";
      worldUsable = captureDivergence(world, c, data, strategy, execs, slot, out);
    }
    if (!options.traceDir.empty() && worldUsable) {
      // As the measured step ran: without the verified results held beside it.
      for (auto& r : results) r.clear();
      try {
        traceStep(world, c, strategy, execs, options.traceDir);
      } catch (const std::exception& e) {
        std::cerr << "stratbench: --trace: " << c.name << " " << strategy.id()
                  << ": the traced step failed: " << errorText(e) << "\n";
      }
    }
  } catch (const std::exception& e) {
    const std::string text = errorText(e);
    for (auto& o : out.ranks) {
      if (o.error.empty()) {
        o.error = text;
        o.errorAtMs = nowMs();
      }
    }
    if (onError) onError();
  }
  return out;
}

double timedStep(World& world, std::vector<std::unique_ptr<RankExecutor>>& execs,
                 std::vector<double>& scratch, std::vector<LiveAfterSteps>* after) {
  world.run([&](RankContext& ctx) {
    StepTimer timer;
    timer.start();
    execs[ctx.rank()]->step(ctx);
    scratch[ctx.rank()] = timer.stopSeconds();
  });
  double slowest = 0;
  for (int r : world.localRanks()) slowest = std::max(slowest, scratch[r]);
  slowest = world.maxOverProcesses(slowest);
  // Once every rank of the mesh is past its step (a peer may hold a tensor of this rank's
  // until it is).
  if (after) {
    for (int r : world.localRanks()) (*after)[r].note(MemoryTracker::instance().current(r));
  }
  return slowest;
}

Record runStrategy(const CaseSpec& c, const reference::WorkloadData& data, const Strategy& strategy,
                   const Provenance& provenance, const RunOptions& options) {
  Record rec = baseRecord(c, strategy, provenance, options.backend);
  if (std::string why = deviceMissing(c); !why.empty()) {
    rec.status = Status::kSkipped;
    rec.message = why;
    return rec;
  }
  const Applicability a = applicabilityOf(strategy, c);
  if (a.kind != Applicability::Kind::kApplies) {
    rec.status = Status::kUnsupported;
    rec.message = a.reason;
    return rec;
  }
  try {
    ThreadsOptions topts;
    topts.timeout = options.collectiveTimeout;
    ThreadsWorld world(DeviceMesh(c.mesh), topts);
    const LocalRun run = runLocal(world, c, data, strategy, options, {});
    return compose(rec, c, data, strategy, run.ranks, run, /*perRankErrors=*/false,
                   profileFor(options, c));
  } catch (const std::exception& e) {
    rec.status = Status::kError;
    rec.message = errorText(e);
  }
  return rec;
}

}  // namespace sb::harness
