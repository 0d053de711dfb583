#include "harness/runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "harness/c10d_backend.h"
#include "harness/device.h"
#include "harness/dist_env.h"
#include "harness/id_pattern.h"
#include "harness/memory.h"
#include "harness/registry.h"
#include "harness/threads_backend.h"
#include "harness/world.h"

namespace sb::harness {
namespace {

using Clock = std::chrono::steady_clock;

std::string errorText(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}
int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json finiteOrText(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(std::to_string(x));
}
double numberOrText(const nlohmann::json& j) {
  return j.is_string() ? std::stod(j.get<std::string>()) : j.get<double>();
}

nlohmann::json checkToJson(const TensorCheck& c) {
  nlohmann::json j;
  j["tensor"] = c.tensor;
  j["rank"] = c.rank;
  j["numel"] = c.numel;
  j["mismatches"] = c.mismatches;
  j["max_abs_err"] = finiteOrText(c.maxAbsErr);
  j["max_rel_err"] = finiteOrText(c.maxRelErr);
  j["err_ratio"] = finiteOrText(c.errRatio);
  j["worst_index"] = c.worstIndex;
  j["worst_actual"] = finiteOrText(c.worstActual);
  j["worst_expected"] = finiteOrText(c.worstExpected);
  j["tolerance"] = c.tolerance;
  if (!c.problem.empty()) j["problem"] = c.problem;
  return j;
}

TensorCheck checkFromJson(const nlohmann::json& j) {
  TensorCheck c;
  c.tensor = j.at("tensor").get<std::string>();
  c.rank = j.at("rank").get<int>();
  c.numel = j.at("numel").get<int64_t>();
  c.mismatches = j.at("mismatches").get<int64_t>();
  c.maxAbsErr = numberOrText(j.at("max_abs_err"));
  c.maxRelErr = numberOrText(j.at("max_rel_err"));
  c.errRatio = numberOrText(j.at("err_ratio"));
  c.worstIndex = j.at("worst_index").get<std::vector<int64_t>>();
  c.worstActual = numberOrText(j.at("worst_actual"));
  c.worstExpected = numberOrText(j.at("worst_expected"));
  c.tolerance = j.at("tolerance").get<std::string>();
  c.problem = j.value("problem", "");
  return c;
}

nlohmann::json commToJson(const CommStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumCollectives; ++i) {
    if (s.entries[i].calls == 0) continue;
    j[collectiveName(static_cast<Collective>(i))] = {{"calls", s.entries[i].calls},
                                                     {"bytes", s.entries[i].bytes}};
  }
  return j;
}

CommStats commFromJson(const nlohmann::json& j) {
  CommStats s;
  for (int i = 0; i < kNumCollectives; ++i) {
    const char* name = collectiveName(static_cast<Collective>(i));
    if (!j.contains(name)) continue;
    s.entries[i].calls = j.at(name).at("calls").get<int64_t>();
    s.entries[i].bytes = j.at(name).at("bytes").get<int64_t>();
  }
  return s;
}

// What one rank learnt in one row. On a c10d backend it travels as JSON to rank 0.
struct RankOutcome {
  explicit RankOutcome(int r = 0) : rank(r) {}
  int rank;
  std::string unsupported;  // prepare() said the case cannot run, and why
  std::string error;        // what went wrong on this rank
  int64_t errorAtMs = 0;    // wall clock of the error, to tell the first failure from its echoes
  int64_t peak = 0;
  CommStats counted, wire;
  std::optional<int64_t> predictedPeak;
  std::optional<int64_t> memoryLimit;            // RankExecutor::memoryLimitBytes
  std::vector<TensorCheck> checks, checksAfter;  // after the measured step, after the timed ones
};

nlohmann::json outcomeToJson(const RankOutcome& o) {
  nlohmann::json j;
  j["rank"] = o.rank;
  j["unsupported"] = o.unsupported;
  j["error"] = o.error;
  j["error_at_ms"] = o.errorAtMs;
  j["peak"] = o.peak;
  j["counted"] = commToJson(o.counted);
  j["wire"] = commToJson(o.wire);
  if (o.predictedPeak) j["predicted_peak"] = *o.predictedPeak;
  if (o.memoryLimit) j["memory_limit"] = *o.memoryLimit;
  nlohmann::json checks = nlohmann::json::array(), after = nlohmann::json::array();
  for (const auto& c : o.checks) checks.push_back(checkToJson(c));
  for (const auto& c : o.checksAfter) after.push_back(checkToJson(c));
  j["checks"] = checks;
  j["checks_after"] = after;
  return j;
}

RankOutcome outcomeFromJson(const nlohmann::json& j) {
  RankOutcome o;
  o.rank = j.at("rank").get<int>();
  o.unsupported = j.at("unsupported").get<std::string>();
  o.error = j.at("error").get<std::string>();
  o.errorAtMs = j.at("error_at_ms").get<int64_t>();
  o.peak = j.at("peak").get<int64_t>();
  o.counted = commFromJson(j.at("counted"));
  o.wire = commFromJson(j.at("wire"));
  if (j.contains("predicted_peak")) o.predictedPeak = j.at("predicted_peak").get<int64_t>();
  if (j.contains("memory_limit")) o.memoryLimit = j.at("memory_limit").get<int64_t>();
  for (const auto& c : j.at("checks")) o.checks.push_back(checkFromJson(c));
  for (const auto& c : j.at("checks_after")) o.checksAfter.push_back(checkFromJson(c));
  return o;
}

// Compares one rank's local tensors with the matching slices of the reference.
std::vector<TensorCheck> verifyRank(const CaseSpec& c, const reference::WorkloadData& data,
                                    const Strategy& strategy, int rank,
                                    const std::map<std::string, at::Tensor>& results) {
  std::vector<TensorCheck> checks;
  for (const auto& name : data.checked) {
    const at::Tensor& full = data.expected.at(name);
    const Tolerance tol = strategy.tolerance(name, c, full);
    const Box box = strategy.resultBoxOf(name, c, rank, full.sizes());
    auto it = results.find(name);
    const at::Tensor actual = it == results.end() ? at::Tensor() : it->second;
    checks.push_back(checkTensor(name, rank, actual, sliceBox(full, box), box.offset, tol));
  }
  return checks;
}

// Elements of each checked tensor that no rank's declared layout holds.
std::vector<std::string> coverageProblems(const CaseSpec& c, const reference::WorkloadData& data,
                                          const Strategy& strategy, int n) {
  std::vector<std::string> problems;
  for (const auto& name : data.checked) {
    const at::Tensor& full = data.expected.at(name);
    at::Tensor covered = at::zeros(full.sizes(), at::kBool);
    for (int r = 0; r < n; ++r) {
      sliceBox(covered, strategy.resultBoxOf(name, c, r, full.sizes())).fill_(true);
    }
    const int64_t missing = full.numel() - covered.sum().item<int64_t>();
    if (missing > 0) {
      problems.push_back(name + ": " + std::to_string(missing) +
                         " elements are held by no rank's declared layout");
    }
  }
  return problems;
}

// Every rank's checks, tensor by tensor in the workload's order, then by rank.
std::vector<TensorCheck> allChecks(const reference::WorkloadData& data,
                                   const std::vector<RankOutcome>& ranks, bool after) {
  std::vector<TensorCheck> out;
  for (const auto& name : data.checked) {
    for (const auto& o : ranks) {
      for (const auto& ch : after ? o.checksAfter : o.checks) {
        if (ch.tensor == name) out.push_back(ch);
      }
    }
  }
  return out;
}

bool allPassed(const std::vector<TensorCheck>& checks, const std::vector<std::string>& problems) {
  return problems.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const auto& c) { return c.passed(); });
}

std::string summarize(const std::vector<TensorCheck>& checks,
                      const std::vector<std::string>& problems) {
  std::ostringstream os;
  int shown = 0;
  for (const auto& p : problems) os << (shown++ ? "; " : "") << p;
  for (const auto& c : checks) {
    if (c.passed()) continue;
    if (shown == 3) {
      os << "; ...";
      break;
    }
    os << (shown++ ? "; " : "") << c.toString();
  }
  return os.str();
}

// What this process ran of one row: its ranks' outcomes, the timing (identical in every
// process: each step's time is the maximum over the mesh), and rank 0's executor details.
struct LocalRun {
  std::vector<RankOutcome> ranks;
  std::optional<TimingStats> timing;
  std::optional<double> predictedTimeUs;
  std::vector<std::pair<std::string, std::string>> params;
  nlohmann::json executorDetails = nlohmann::json::object();
  // On CUDA: the caching allocator's own numbers for the measured step (this process's device).
  nlohmann::json deviceMemory;
};

std::atomic<int> measuredSteps{0};

// A planted rank fault: in the measured step of the rank's `row`-th row.
void maybeFireRankFault(const RunOptions& options, int rank) {
  if (!options.rankFault || options.rankFault->rank != rank) return;
  if (++measuredSteps != options.rankFault->row) return;
  switch (options.rankFault->kind) {
    case RunOptions::RankFault::Kind::kThrow:
      throw std::runtime_error("planted fault: rank " + std::to_string(rank) +
                               " threw in its measured step");
    case RunOptions::RankFault::Kind::kCrash:
      std::cerr << "[rank " << rank << "] planted fault: killing myself with SIGKILL" << std::endl;
      ::kill(::getpid(), SIGKILL);
      break;
    case RunOptions::RankFault::Kind::kHang:
      std::cerr << "[rank " << rank << "] planted fault: hanging" << std::endl;
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

// The phases of one row on this process's ranks: prepare, a warm-up step, the measured step
// (memory, communication, numerics), Google Benchmark timing, and the check that the timed
// steps still give the verified results. An error is recorded on the local ranks and
// `onError` runs (a c10d backend drops its groups, so that peers fail at once).
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
  std::vector<int64_t> peak(n, 0);
  try {
    MemoryTracker::instance().install();
    std::mutex mu;
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      execs[r] = strategy.makeExecutor(c);
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
    world.resetStats();
    const bool cuda = reference::caseDevice().is_cuda();
    DeviceMemoryStats before;
    const int64_t hookBefore = cudaAllocationsSeen();
    if (cuda) {
      resetDevicePeak();
      before = deviceMemoryStats();
    }
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      MemoryTracker::instance().resetPeak(r);
      maybeFireRankFault(options, r);
      execs[r]->step(ctx);
      peak[r] = MemoryTracker::instance().peak(r);
      MemoryTracker::instance().traceNote(r, "end of the measured step");
    });
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
        // (the allocator's own peak over the start is beside them).
        out.deviceMemory["note"] =
            "the allocation hook saw no allocation of this step: per-rank peaks are not known";
      }
    }
    for (int r : local) {
      out.ranks[slot[r]].counted = world.stats(r);
      out.ranks[slot[r]].wire = world.wireStats(r);
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
      o.peak = peak[r];
      o.predictedPeak = execs[r]->predictedPeakBytes();
      if (!o.predictedPeak) o.predictedPeak = strategy.predictPeakMemory(c, r);
      o.memoryLimit = execs[r]->memoryLimitBytes();
    }
    if (slot[0] >= 0) {
      out.predictedTimeUs = execs[0]->predictedTimeUs();
      out.params = execs[0]->recordParams();
      out.executorDetails = execs[0]->details();
    }

    // Timing: the slowest rank's step time per iteration.
    out.timing =
        timeWithBenchmark(c.suite + "/" + c.name + "/" + strategy.id(), c.repetitions, c.minTimeSec,
                          options.warmupSec, [&] { return timedStep(world, execs, stepSeconds); });

    // As nccl-tests does, the timed runs are verified too: the last timed step must still
    // give the reference results (catches state that leaks from step to step).
    takeResults();
    for (int r : local) {
      out.ranks[slot[r]].checksAfter = verifyRank(c, data, strategy, r, results[r]);
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

// The first failure and the ranks that failed after it (on a broken group).
std::string errorMessage(const std::vector<RankOutcome>& ranks, bool perRankErrors) {
  const RankOutcome* first = nullptr;
  for (const auto& o : ranks) {
    if (!o.error.empty() && (!first || o.errorAtMs < first->errorAtMs)) first = &o;
  }
  if (!first) return "";
  if (!perRankErrors) return first->error;
  std::string msg = "rank " + std::to_string(first->rank) + ": " + first->error;
  std::string echoes;
  for (const auto& o : ranks) {
    if (&o == first || o.error.empty()) continue;
    echoes += (echoes.empty() ? "" : ", ") + std::to_string(o.rank);
  }
  if (!echoes.empty()) msg += " (then ranks " + echoes + " failed on the broken group)";
  return msg;
}

// The calibration profile of a backend and mesh, if one was given.
const CostProfile* profileFor(const RunOptions& options, const CaseSpec& c) {
  for (const auto& p : options.costProfiles) {
    if (p.backend == options.backend && p.mesh == c.meshString()) return &p;
  }
  return nullptr;
}

// The cost model, per rank, the slowest rank's: the step's fixed cost (an empty step, where
// the profile measured it), three matmuls (the profile's matmul fit) where the strategy models
// its flops, its communication (each group's fits) and its local copies (the copy fit) where
// it models them.
void predictTime(Record& rec, const CaseSpec& c, const Strategy& strategy, int n,
                 const CostProfile& profile) {
  double worst = -1, computeUs = 0, commUs = 0, localUs = 0;
  const double overheadUs = profile.stepUs.value_or(0.0);
  for (int r = 0; r < n; ++r) {
    const std::optional<double> flops = strategy.predictFlops(c, r);
    if (!flops) return;
    double comm = 0;
    for (const auto& [axes, stats] : strategy.predictCommByGroup(c, r)) {
      const std::optional<double> us = profile.commUs(axes, stats);
      if (!us) return;  // a collective the profile did not measure
      comm += *us;
    }
    // A strategy with no matmuls (a redistribution) models zero flops.
    const double compute =
        *flops > 0 ? 3 * profile.gemm.latencyUs + profile.gemm.usPerByte * *flops : 0.0;
    double local = 0;
    if (const auto work = strategy.predictLocalWork(c, r)) {
      const std::optional<double> us = profile.localUs(*work);
      if (!us) return;  // an older profile without the copy fit
      local = *us;
    }
    if (overheadUs + compute + comm + local > worst) {
      worst = overheadUs + compute + comm + local;
      computeUs = compute;
      commUs = comm;
      localUs = local;
    }
  }
  rec.predictedTimeUs = worst;
  rec.details["predicted_time"] = {{"step_overhead_us", overheadUs},
                                   {"compute_us", computeUs},
                                   {"comm_us", commUs},
                                   {"local_us", localUs},
                                   {"profile", profile.backend + " " + profile.mesh + " on " +
                                                   profile.host + " at " + profile.timestampUtc}};
}

// Every prediction against its measurement: the relative error, in details["prediction"],
// and Record::mispredicted where it is past the strategy's stated tolerance. Returns the
// sentence for the message ("" when nothing is mispredicted).
std::string judgePredictions(Record& rec, const Strategy::PredictionTolerance& tol) {
  nlohmann::json j = nlohmann::json::object();
  std::vector<std::string> flagged, why;
  const auto judge = [&](const char* what, const char* unit, double measured, double predicted,
                         const std::optional<double>& tolerance) {
    const double err = measured != 0
                           ? std::abs(measured - predicted) / std::abs(measured)
                           : (predicted == 0 ? 0.0 : std::numeric_limits<double>::infinity());
    j[what] = {{"measured", measured},
               {"predicted", predicted},
               {"relative_error", std::isfinite(err) ? nlohmann::json(err)
                                  : std::isnan(err)  ? nlohmann::json("nan")
                                                     : nlohmann::json("inf")},
               {"tolerance", tolerance ? nlohmann::json(*tolerance) : nlohmann::json("none")}};
    if (tolerance && !(err <= *tolerance)) {
      flagged.push_back(what);
      // Bytes as integers; the error with the digits that show it past the claim.
      std::ostringstream s;
      s << what << " measured " << std::fixed << std::setprecision(unit[0] == 'b' ? 0 : 1)
        << measured << " " << unit << ", predicted " << predicted << " " << unit << " ("
        << std::defaultfloat << std::setprecision(6) << 100 * err << "% off; the strategy claims "
        << 100 * *tolerance << "%)";
      why.push_back(s.str());
    }
  };
  if (rec.peakMemBytes && rec.predictedMemBytes) {
    judge("memory", "bytes", static_cast<double>(*rec.peakMemBytes),
          static_cast<double>(*rec.predictedMemBytes), tol.memory);
  }
  if (rec.timing && rec.predictedTimeUs) {
    judge("time", "us", rec.timing->medianUs, *rec.predictedTimeUs, tol.time);
  }
  if (!j.empty()) rec.details["prediction"] = j;
  std::string flags, text;
  for (size_t i = 0; i < flagged.size(); ++i) {
    flags += (i ? "+" : "") + flagged[i];
    text += (i ? "; " : "") + why[i];
  }
  rec.mispredicted = flags;
  return text.empty() ? "" : "mispredicted: " + text;
}

// The record of one row from every rank's outcome (all ranks of the mesh, in rank order).
Record compose(Record rec, const CaseSpec& c, const reference::WorkloadData& data,
               const Strategy& strategy, const std::vector<RankOutcome>& ranks,
               const LocalRun& rank0, bool perRankErrors, const CostProfile* profile) {
  rec.details["case"] = strategy.caseDetails(c);
  {
    const std::string& first = data.checked.front();
    const Tolerance tol = strategy.tolerance(first, c, data.expected.at(first));
    rec.atol = tol.atol;
    rec.rtol = tol.rtol;
    rec.tolerance = tol.toString();
  }
  if (const std::string err = errorMessage(ranks, perRankErrors); !err.empty()) {
    rec.status = Status::kError;
    rec.message = err;
    return rec;
  }
  for (const auto& o : ranks) {
    if (!o.unsupported.empty()) {
      rec.status = Status::kUnsupported;
      rec.message = o.unsupported;
      return rec;
    }
  }
  const int n = static_cast<int>(ranks.size());
  const std::vector<std::string> problems = coverageProblems(c, data, strategy, n);
  const std::vector<TensorCheck> checks = allChecks(data, ranks, false);
  const std::vector<TensorCheck> after = allChecks(data, ranks, true);
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& ch : checks) tensors.push_back(checkToJson(ch));
  rec.details["tensors"] = tensors;
  double maxAbs = 0, maxRel = 0;
  int64_t mism = 0;
  for (const auto& ch : checks) {
    maxAbs = std::max(maxAbs, ch.maxAbsErr);
    maxRel = std::max(maxRel, ch.maxRelErr);
    mism += ch.mismatches;
  }
  rec.maxAbsErr = maxAbs;
  rec.maxRelErr = maxRel;
  rec.mismatches = mism;
  // Per tensor, the worst rank's distance to tolerance; the record's is the worst tensor's.
  for (const auto& ch : checks) {
    auto it = std::find_if(rec.tensorErrRatio.begin(), rec.tensorErrRatio.end(),
                           [&](const auto& p) { return p.first == ch.tensor; });
    if (it == rec.tensorErrRatio.end()) {
      rec.tensorErrRatio.emplace_back(ch.tensor, ch.errRatio);
    } else if (!(ch.errRatio <= it->second)) {  // NaN-safe: NaN replaces anything
      it->second = ch.errRatio;
    }
    if (!rec.errRatio || !(ch.errRatio <= *rec.errRatio)) {
      rec.errRatio = ch.errRatio;
      rec.worstTensor = ch.tensor;
    }
  }

  // Communication: counted by the backend against the strategy's prediction, per rank; where
  // the backend emulated a collective, what crossed the wire is kept beside it.
  int64_t commMax = 0, predMax = 0, callsMax = 0;
  std::string commProblem;
  nlohmann::json commRanks = nlohmann::json::array();
  std::optional<int64_t> memPredMax;
  std::vector<int64_t> peaks, memLimits;
  std::string memProblem;
  for (const auto& o : ranks) {
    const CommStats predicted = strategy.predictComm(c, o.rank);
    commMax = std::max(commMax, o.counted.totalBytes());
    predMax = std::max(predMax, predicted.totalBytes());
    callsMax = std::max(callsMax, o.counted.totalCalls());
    nlohmann::json entry = {
        {"rank", o.rank}, {"counted", commToJson(o.counted)}, {"predicted", commToJson(predicted)}};
    if (!(o.wire == o.counted)) entry["wire"] = commToJson(o.wire);
    commRanks.push_back(entry);
    if (!(o.counted == predicted) && commProblem.empty()) {
      commProblem = "rank " + std::to_string(o.rank) + " communicated " + o.counted.toString() +
                    " but the strategy predicts " + predicted.toString();
    }
    if (o.predictedPeak) memPredMax = std::max(memPredMax.value_or(0), *o.predictedPeak);
    peaks.push_back(o.peak);
    if (o.memoryLimit && o.peak > *o.memoryLimit && memProblem.empty()) {
      memProblem = "rank " + std::to_string(o.rank) + " peaked at " + std::to_string(o.peak) +
                   " bytes, over the " + std::to_string(*o.memoryLimit) +
                   " bytes it promised to stay within (the case's memory budget)";
    }
    if (o.memoryLimit) memLimits.push_back(*o.memoryLimit);
  }
  if (!memLimits.empty()) rec.details["memory_limit_bytes_per_rank"] = memLimits;
  rec.commBytes = commMax;
  rec.predictedCommBytes = predMax;
  rec.commCalls = callsMax;
  rec.details["comm_per_rank"] = commRanks;
  rec.peakMemBytes = *std::max_element(peaks.begin(), peaks.end());
  rec.predictedMemBytes = memPredMax;
  rec.details["peak_mem_bytes_per_rank"] = peaks;
  rec.predictedTimeUs = rank0.predictedTimeUs;
  if (!rec.predictedTimeUs && profile) predictTime(rec, c, strategy, n, *profile);
  rec.params = rank0.params;
  if (!rank0.executorDetails.empty()) rec.details["executor"] = rank0.executorDetails;
  if (!rank0.deviceMemory.is_null()) rec.details["cuda_allocator"] = rank0.deviceMemory;
  if (rank0.timing) rec.timing = *rank0.timing;
  const std::string mispredicted = judgePredictions(rec, strategy.predictionTolerance());

  if (!allPassed(checks, problems)) {
    rec.status = Status::kFail;
    rec.message = summarize(checks, problems);
  } else if (!allPassed(after, {})) {
    rec.status = Status::kFail;
    rec.message = "results changed during the timed steps: " + summarize(after, {});
  } else if (!commProblem.empty()) {
    rec.status = Status::kFail;
    rec.message = commProblem;
  } else if (!memProblem.empty()) {
    rec.status = Status::kFail;
    rec.message = memProblem;
  } else {
    rec.status = Status::kPass;
  }
  if (!mispredicted.empty()) {
    rec.message += (rec.message.empty() ? "" : "; ") + mispredicted;
  }
  return rec;
}

}  // namespace

double timedStep(World& world, std::vector<std::unique_ptr<RankExecutor>>& execs,
                 std::vector<double>& scratch) {
  world.run([&](RankContext& ctx) {
    StepTimer timer;
    timer.start();
    execs[ctx.rank()]->step(ctx);
    scratch[ctx.rank()] = timer.stopSeconds();
  });
  double slowest = 0;
  for (int r : world.localRanks()) slowest = std::max(slowest, scratch[r]);
  return world.maxOverProcesses(slowest);
}

RunOptions::RankFault parseRankFault(const std::string& text) {
  RunOptions::RankFault f;
  const auto at = text.find('@');
  const auto at2 = at == std::string::npos ? at : text.find('@', at + 1);
  const std::string kind = text.substr(0, at);
  bool ok = at != std::string::npos;
  if (kind == "throw") {
    f.kind = RunOptions::RankFault::Kind::kThrow;
  } else if (kind == "crash") {
    f.kind = RunOptions::RankFault::Kind::kCrash;
  } else if (kind == "hang") {
    f.kind = RunOptions::RankFault::Kind::kHang;
  } else {
    ok = false;
  }
  if (ok) {
    try {
      const std::string rankText =
          text.substr(at + 1, at2 == std::string::npos ? at2 : at2 - at - 1);
      size_t used = 0;
      f.rank = std::stoi(rankText, &used);
      ok = used == rankText.size() && f.rank >= 0;
      if (ok && at2 != std::string::npos) {
        const std::string rowText = text.substr(at2 + 1);
        f.row = std::stoi(rowText, &used);
        ok = used == rowText.size() && f.row >= 1;
      }
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok) {
    throw InputError("--plant-rank-fault '" + text +
                     "': expected KIND@RANK[@ROW] with KIND throw, crash or hang, e.g. crash@2 or "
                     "hang@1@5 (the rank's fifth row)");
  }
  return f;
}

// Why this process cannot run a case on its device ("" when it can): a case on `device: cuda`
// where LibTorch has no CUDA or no device is found is skipped, saying which.
std::string deviceMissing(const CaseSpec& c) {
  std::string why;
  if (c.device == "cuda" && !cudaUsable(&why)) return "device cuda: " + why;
  return "";
}

Record baseRecord(const CaseSpec& c, const Strategy& s, const Provenance& p,
                  const std::string& backend) {
  Record r;
  r.provenance = p;
  if (c.device == "cuda" && cudaUsable(nullptr)) {
    const int d = currentCudaDevice();
    r.provenance.device = "cuda:" + std::to_string(d) + " (" + cudaDeviceDescription(d) + ")";
  }
  r.backend = backend;
  r.worldSize = static_cast<int>(c.meshSize());
  r.mesh = c.meshString();
  r.suite = c.suite;
  r.caseName = c.name;
  r.workload = c.workload;
  r.shape = reference::findWorkload(c.workload)->shapeString(c.shape);
  r.dtype = dtypeName(c.dtype);
  r.inputs = c.inputs == reference::InputMode::kExact ? "exact" : "random";
  r.seed = c.seed;
  r.family = familyName(s.family());
  r.strategyId = s.id();
  r.strategy = s.displayName();
  r.repetitions = c.repetitions;
  r.status = Status::kUnsupported;
  return r;
}

std::vector<PlannedCase> planSuite(const Suite& suite, const RunOptions& options) {
  {
    const auto have = availableBackends();
    if (std::find(have.begin(), have.end(), options.backend) == have.end()) {
      std::string list;
      for (const auto& b : have) list += (list.empty() ? "" : ", ") + b;
      throw InputError("backend '" + options.backend + "' is not available in this build (" + list +
                       ")");
    }
    if (options.rankFault && options.backend == "threads") {
      throw InputError("--plant-rank-fault needs a multi-process backend (--backend gloo)");
    }
  }
  std::optional<IdPattern> filter;
  if (!options.filter.empty()) {
    try {
      filter.emplace(options.filter);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("--filter: ") + e.what());
    }
  }
  auto& registry = StrategyRegistry::global();
  std::vector<PlannedCase> plan;
  size_t selected = 0;
  for (CaseSpec c : suite.cases) {
    const nlohmann::json userParams = c.params;  // before the runner adds its own
    if (options.repetitions) c.repetitions = *options.repetitions;
    if (options.seed) c.seed = *options.seed;
    if (options.minTimeSec) c.minTimeSec = *options.minTimeSec;
    c.backend = options.backend;
    // Strategies that price a plan they choose (auto-sharding) read the case's profile here.
    if (const CostProfile* p = profileFor(options, c); p && !c.params.contains("cost_profile")) {
      c.params["cost_profile"] = p->toJson();
    }
    if (options.worldSize && c.meshSize() != *options.worldSize) {
      throw InputError(c.where() + ": case '" + c.name + "' has mesh " + c.meshString() + " (" +
                       std::to_string(c.meshSize()) + " ranks) but the world size is " +
                       std::to_string(*options.worldSize));
    }
    try {
      registry.expandFor(c);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw InputError(c.where() + ": case '" + c.name + "': " + errorText(e));
    }
    PlannedCase pc{c, {}};
    std::vector<const Strategy*> chosen;
    for (const auto& pattern : c.strategies) {
      std::vector<const Strategy*> matched;
      if (const Strategy* exact = registry.find(pattern)) {
        // Named by id: the user asked for exactly this strategy on this case, so a case it
        // cannot run is an error in the suite, not a row.
        const Applicability a = exact->applies(c);
        if (a.kind != Applicability::Kind::kApplies) {
          throw InputError(c.where() + ": case '" + c.name + "': strategy '" + pattern +
                           "' cannot run it: " + a.reason);
        }
        matched.push_back(exact);
      } else {
        try {
          matched = registry.matching(pattern);
        } catch (const c10::Error& e) {
          throw InputError(c.where() + ": case '" + c.name + "': " + e.what_without_backtrace());
        }
        if (matched.empty()) {
          throw InputError(c.where() + ": case '" + c.name + "': '" + pattern +
                           "' is neither a strategy id nor a pattern matching one (see "
                           "`stratbench list`)");
        }
      }
      for (const Strategy* s : matched) {
        if (std::find(chosen.begin(), chosen.end(), s) == chosen.end()) chosen.push_back(s);
      }
    }
    // A parameter that none of the case's strategies reads would be silently ignored (a
    // misspelt `budgt: 0.5` ran with no budget and passed): refused, naming the key.
    {
      std::set<std::string> known;
      for (const Strategy* s : chosen) {
        for (const auto& k : s->caseParams()) known.insert(k);
      }
      for (const auto& item : userParams.items()) {
        if (known.count(item.key())) continue;
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw InputError(
            c.where() + ": case '" + c.name + "': params key '" + item.key() +
            "' is read by none of its strategies (" +
            (known.empty() ? std::string("they read no parameters") : "they read: " + list) + ")");
      }
    }
    for (const Strategy* s : chosen) {
      if (filter && !filter->search(s->id())) continue;
      Applicability a = s->applies(c);
      if (a.kind == Applicability::Kind::kNotApplicable) continue;
      pc.strategies.push_back({s, a, nullptr});
    }
    selected += pc.strategies.size();
    if (!pc.strategies.empty()) plan.push_back(std::move(pc));
  }
  for (const auto& [id, fault] : options.plantedFaults) {
    const Strategy* s = registry.find(id);
    if (!s) throw InputError("--plant-fault: no strategy has the id '" + id + "'");
    std::shared_ptr<const Strategy> faulty = s->withPlantedFault(fault);
    if (!faulty) {
      std::string can;
      for (const auto& f : s->plantableFaults()) can += (can.empty() ? "" : ", ") + f;
      throw InputError("--plant-fault: strategy '" + id + "' has no fault '" + fault +
                       "' (it has: " + (can.empty() ? "none" : can) + ")");
    }
    bool used = false;
    for (auto& pc : plan) {
      for (auto& e : pc.strategies) {
        if (e.strategy == s) {
          e.owned = faulty;
          e.strategy = faulty.get();
          used = true;
        }
      }
    }
    if (!used) throw InputError("--plant-fault: strategy '" + id + "' runs in no case");
  }
  if (selected == 0) {
    throw InputError(suite.file + ": " +
                     (options.filter.empty()
                          ? std::string("no case selects a strategy that "
                                        "applies to it")
                          : "--filter '" + options.filter + "' selects no strategy of any case"));
  }
  return plan;
}

Record runStrategy(const CaseSpec& c, const reference::WorkloadData& data, const Strategy& strategy,
                   const Provenance& provenance, const RunOptions& options) {
  Record rec = baseRecord(c, strategy, provenance, options.backend);
  if (std::string why = deviceMissing(c); !why.empty()) {
    rec.status = Status::kSkipped;
    rec.message = why;
    return rec;
  }
  const Applicability a = strategy.applies(c);
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

namespace {

// One row as the suite loop sees it: the record (on the writing process) and whether the run
// must stop.
struct RowResult {
  std::optional<Record> record;
  bool stop = false;
};
using RowFn = std::function<RowResult(const CaseSpec&, const reference::WorkloadData*,
                                      const std::string& buildError, const Strategy&)>;

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << ms.count() / 1000.0 << " s";
  return os.str();
}

// Set when this rank stopped because rank 0 is gone or silent: it exits 1, so that a launcher
// sees a failure.
bool lostRank0 = false;

// A row of a multi-process run; see runPlanned in runner.h.
RowResult distributedRow(Session& session, int64_t seq, const CaseSpec& c,
                         const reference::WorkloadData* data, const std::string& buildError,
                         const Strategy& strategy, const Provenance& prov,
                         const RunOptions& options) {
  const bool writer = session.rank() == 0;
  Record rec = baseRecord(c, strategy, prov, options.backend);
  const DeviceMesh mesh(c.mesh);
  // Decided alike on every rank: no exchange needed.
  if (mesh.size() > session.worldSize()) {
    rec.status = Status::kSkipped;
    rec.message = "mesh " + mesh.toString() + " needs " + std::to_string(mesh.size()) +
                  " ranks but this run has " + std::to_string(session.worldSize()) +
                  " (start it with `stratbench launch -n " + std::to_string(mesh.size()) + "`)";
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }
  if (std::string why = deviceMissing(c); !why.empty()) {
    rec.status = Status::kSkipped;
    rec.message = why;
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }
  if (const Applicability a = strategy.applies(c); a.kind != Applicability::Kind::kApplies) {
    rec.status = Status::kUnsupported;
    rec.message = a.reason;
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }

  const std::string key = "sb/row/" + std::to_string(seq);
  const int rank = session.rank();
  const bool inMesh = rank < mesh.size();
  LocalRun local;
  if (inMesh) {
    World* world = nullptr;
    std::string failure = buildError;
    if (failure.empty()) {
      try {
        world = session.world(mesh);
      } catch (const std::exception& e) {
        failure = "building the " + options.backend + " process groups failed: " + errorText(e);
        session.dropGroups();
      }
    }
    if (world) {
      local = runLocal(*world, c, *data, strategy, options, [&] { session.dropGroups(); });
    } else {
      local.ranks = {RankOutcome(rank)};
      local.ranks[0].error = failure;
      local.ranks[0].errorAtMs = nowMs();
    }
    if (!local.ranks[0].error.empty()) {
      // One write, so that the ranks' lines do not interleave.
      std::cerr << ("[rank " + std::to_string(rank) + "] " + c.name + " " + strategy.id() + ": " +
                    local.ranks[0].error + "\n");
    }
    if (!writer) {
      try {
        session.store().set(key + "/rank" + std::to_string(rank),
                            outcomeToJson(local.ranks[0]).dump());
      } catch (const std::exception& e) {
        // The store went with rank 0 (srun, mpirun: rank 0 serves it).
        std::cerr << ("[rank " + std::to_string(rank) + "] lost the store: " + errorText(e) + "\n");
        lostRank0 = true;
        return {std::nullopt, true};
      }
    }
  }

  std::string action = "continue";
  const auto timeout = session.timeout();
  if (writer) {
    // Every rank of the mesh reports; one that died or hangs never does.
    std::vector<RankOutcome> ranks{local.ranks[0]};
    std::vector<std::string> missing;
    // A live rank blocked on a hung one fails at its own collective's timeout, within this.
    const auto deadline = ControlStore::Clock::now() + timeout;
    for (int r = 1; r < mesh.size(); ++r) {
      std::optional<std::string> dead;
      auto v = session.store().waitFor(key + "/rank" + std::to_string(r), deadline, [&] {
        dead = session.store().get(deadRankKey(r));
        return dead.has_value();
      });
      if (v) {
        ranks.push_back(outcomeFromJson(nlohmann::json::parse(*v)));
      } else if (dead) {
        missing.push_back("rank " + std::to_string(r) + " " + *dead);
      } else {
        missing.push_back("rank " + std::to_string(r) + " did not finish within the " +
                          seconds(timeout) + " timeout (hung or unreachable)");
      }
    }
    if (!missing.empty()) {
      rec.status = Status::kError;
      std::string msg;
      for (const auto& m : missing) msg += (msg.empty() ? "" : "; ") + m;
      rec.message = msg + " in case " + c.name + ", strategy " + strategy.id() +
                    ": the process groups cannot be rebuilt without it, so the run stops";
      if (const std::string others = errorMessage(ranks, true); !others.empty()) {
        rec.message += " (" + others + ")";
      }
      action = "stop";
    } else if (data) {
      try {
        rec = compose(rec, c, *data, strategy, ranks, local, /*perRankErrors=*/true,
                      profileFor(options, c));
      } catch (const std::exception& e) {
        rec.status = Status::kError;
        rec.message = "composing the record failed: " + errorText(e);
      }
    } else {
      rec.status = Status::kError;
      rec.message = buildError;
    }
    // Any rank that failed has dropped its groups: every rank starts the next row afresh.
    if (action != "stop" &&
        (rec.status == Status::kError ||
         std::any_of(ranks.begin(), ranks.end(), [](const auto& o) { return !o.error.empty(); }))) {
      action = "rebuild";
    }
    session.store().set(key + "/verdict", action);
  } else {
    // A rank of the mesh hears within two timeouts; one outside it waits as long as rank 0
    // lives (the launcher marks a dead rank 0).
    const auto deadline = inMesh
                              ? ControlStore::Clock::now() + 2 * timeout + std::chrono::seconds(5)
                              : ControlStore::Clock::time_point::max();
    std::optional<std::string> v;
    try {
      v = session.store().waitFor(key + "/verdict", deadline, [&] {
        return session.store().get(deadRankKey(0)) || session.store().get("sb/abandoned");
      });
    } catch (const std::exception& e) {
      // The store went with rank 0 (srun, mpirun: rank 0 serves it).
      std::cerr << ("[rank " + std::to_string(rank) + "] lost the store: " + errorText(e) + "\n");
    }
    if (v) {
      action = *v;
    } else {
      std::cerr << ("[rank " + std::to_string(rank) + "] rank 0 gave no verdict on case " + c.name +
                    " " + strategy.id() + "; stopping\n");
      action = "stop";
      lostRank0 = true;
      // Ranks outside the mesh wait on rank 0 without a deadline: tell them.
      try {
        session.store().set("sb/abandoned", std::to_string(rank));
      } catch (const std::exception&) {
      }
    }
  }
  if (action == "rebuild") session.rebuild();
  return {writer ? std::optional<Record>(rec) : std::nullopt, action == "stop"};
}

// Drops everything written to it: the progress output of ranks other than 0.
class NullBuffer final : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

// Runs the plan row by row through `row`, printing progress and, when `writes`, the results.
int runLoop(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
            const Provenance& prov, std::ostream& out, bool writes, const RowFn& row) {
  nlohmann::json runInfo = {
      {"run_id", prov.runId},       {"git_sha", prov.gitSha}, {"timestamp_utc", prov.timestampUtc},
      {"host", prov.host},          {"device", prov.device},  {"torch_version", prov.torchVersion},
      {"backend", options.backend}, {"suite", suite.name},    {"suite_file", suite.file}};
  std::optional<ResultWriter> writer;
  if (writes) writer.emplace(options.outDir, runInfo);
  out << "stratbench run " << suite.name << " (" << plan.size() << " cases, backend "
      << options.backend << ", run " << prov.runId << ")\n";

  struct Tally {
    int pass = 0, fail = 0, error = 0, unsupported = 0, skipped = 0;
    void add(Status s) {
      switch (s) {
        case Status::kPass:
          ++pass;
          break;
        case Status::kFail:
          ++fail;
          break;
        case Status::kError:
          ++error;
          break;
        case Status::kUnsupported:
          ++unsupported;
          break;
        case Status::kSkipped:
          ++skipped;
          break;
      }
    }
  };
  std::vector<std::pair<std::string, Tally>> tallies;
  std::vector<Record> bad;
  Tally total;
  const auto runStart = Clock::now();
  // LibTorch settles its intra-op thread count lazily, at the first parallel region or
  // get_num_threads() (the threads backend's world asks). Until then OpenMP's default is in
  // force, which can differ (logical cores against LibTorch's physical ones), and BLAS splits
  // a matmul by it: a reference built before the first world would not be bitwise the
  // numbers of the same arithmetic run after it. Settled here, before the first reference.
  at::internal::lazy_init_num_threads();
  bool stopped = false;
  for (size_t i = 0; i < plan.size() && !stopped; ++i) {
    const CaseSpec& c = plan[i].spec;
    const auto t0 = Clock::now();
    Tally tally;
    reference::WorkloadData data;
    std::string buildError;
    // The reference and every strategy of the case make their tensors on its device.
    const bool onDevice = c.device == "cuda" && deviceMissing(c).empty();
    reference::setCaseDevice(onDevice ? at::Device(at::kCUDA, currentCudaDevice())
                                      : at::Device(at::kCPU));
    if (onDevice) installCudaMemoryTracking(nullptr);
    try {
      if (c.device != "cuda" || onDevice) {
        data = reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
        if (onDevice) synchronizeDevice();
      }
    } catch (const std::exception& e) {
      buildError = "reference failed: " + errorText(e);
    }
    for (const auto& entry : plan[i].strategies) {
      RowResult result = row(c, buildError.empty() ? &data : nullptr, buildError, *entry.strategy);
      stopped = result.stop;
      if (result.record) {
        const Record& rec = *result.record;
        if (writer) writer->add(rec);
        tally.add(rec.status);
        total.add(rec.status);
        if (rec.status == Status::kFail || rec.status == Status::kError) bad.push_back(rec);
      }
      if (stopped) break;
    }
    if (writer) writer->flush();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    out << "[" << (i + 1) << "/" << plan.size() << "] " << c.name << " (" << c.workload << " "
        << reference::findWorkload(c.workload)->shapeString(c.shape) << ", mesh " << c.meshString()
        << ", " << dtypeName(c.dtype)
        << (c.inputs == reference::InputMode::kExact ? ", exact inputs" : "") << "): " << tally.pass
        << " pass, " << tally.fail << " fail, " << tally.error << " error, " << tally.unsupported
        << " unsupported  " << std::fixed << std::setprecision(1) << secs << " s\n"
        << std::defaultfloat;
    out.flush();
    tallies.emplace_back(c.name, tally);
  }

  size_t width = 4;
  for (const auto& [name, t] : tallies) width = std::max(width, name.size());
  out << "\n"
      << std::left << std::setw(width) << "case"
      << "  pass  fail error unsup\n";
  for (const auto& [name, t] : tallies) {
    out << std::left << std::setw(width) << name << std::right << std::setw(6) << t.pass
        << std::setw(6) << t.fail << std::setw(6) << t.error << std::setw(6) << t.unsupported
        << "\n";
  }
  out << std::left << std::setw(width) << "total" << std::right << std::setw(6) << total.pass
      << std::setw(6) << total.fail << std::setw(6) << total.error << std::setw(6)
      << total.unsupported << "\n";
  for (const auto& r : bad) {
    out << statusName(r.status) << ": " << r.caseName << " " << r.strategyId << ": " << r.message
        << "\n";
  }
  if (stopped) out << "stopped: a rank was lost; every finished row is in the results\n";
  if (!writer) return 0;  // rank 0 carries the verdict and the exit code
  writer->commit();
  out << "results: " << writer->csvPath() << ", " << writer->jsonPath() << " (" << std::fixed
      << std::setprecision(1) << std::chrono::duration<double>(Clock::now() - runStart).count()
      << " s)\n"
      << std::defaultfloat;
  return (total.fail + total.error) > 0 || stopped ? 1 : 0;
}

}  // namespace

int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               std::ostream& out) {
  if (options.backend == "threads") {
    const Provenance prov = Provenance::collect();
    return runLoop(suite, plan, options, prov, out, true,
                   [&](const CaseSpec& c, const reference::WorkloadData* data,
                       const std::string& buildError, const Strategy& s) -> RowResult {
                     if (!data) {
                       Record rec = baseRecord(c, s, prov, options.backend);
                       rec.status = Status::kError;
                       rec.message = buildError;
                       return {rec, false};
                     }
                     return {runStrategy(c, *data, s, prov, options), false};
                   });
  }
  DistEnv env;
  try {
    env = detectDistEnv();
  } catch (const DistEnvError& e) {
    throw InputError(e.what());
  }
  // A peer that vanishes mid-send must be an error on this rank, not a SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  Session session(env, options.backend, options.collectiveTimeout);
  NullBuffer nothing;
  std::ostream quiet(&nothing);
  if (session.rank() == 0) {
    out << "stratbench: " << env.worldSize << " ranks on " << options.backend << " (launcher "
        << env.launcher << ", store " << env.masterAddr << ":" << env.masterPort << ", rank 0 at "
        << session.localAddress() << ", timeout " << seconds(options.collectiveTimeout) << ")\n";
  }
  const Provenance prov = Provenance::collect();
  int64_t seq = 0;
  const int rc =
      runLoop(suite, plan, options, prov, session.rank() == 0 ? out : quiet, session.rank() == 0,
              [&](const CaseSpec& c, const reference::WorkloadData* data,
                  const std::string& buildError, const Strategy& s) {
                return distributedRow(session, seq++, c, data, buildError, s, prov, options);
              });
  // Where rank 0 serves the store (srun, mpirun, torchrun without its agent store), it stays
  // until every rank has read the last verdict; a lost rank never does, hence the bound.
  try {
    session.store().add("sb/finished", 1);
    if (session.rank() == 0 && !env.agentServesStore) {
      const auto deadline = ControlStore::Clock::now() + std::chrono::seconds(rc == 0 ? 30 : 5);
      while (session.store().add("sb/finished", 0) < env.worldSize &&
             ControlStore::Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  } catch (const std::exception&) {
    // The store is gone: nothing left to wait for.
  }
  return lostRank0 ? 1 : rc;
}

}  // namespace sb::harness
