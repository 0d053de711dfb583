#include "harness/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <mutex>
#include <ostream>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>

#include "harness/memory.h"
#include "harness/registry.h"
#include "harness/threads_backend.h"

namespace sb::harness {
namespace {

using Clock = std::chrono::steady_clock;

std::string errorText(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

// Compares every rank's local tensors with the matching slices of the reference, and checks
// that the declared layouts cover every element of every tensor.
struct Verification {
  std::vector<TensorCheck> checks;
  std::vector<std::string> problems;  // coverage problems
  bool passed() const {
    if (!problems.empty()) return false;
    for (const auto& c : checks) {
      if (!c.passed()) return false;
    }
    return true;
  }
};

Verification verify(const CaseSpec& c, const reference::WorkloadData& data,
                    const Strategy& strategy,
                    const std::vector<std::map<std::string, at::Tensor>>& results) {
  Verification v;
  const int n = static_cast<int>(results.size());
  for (const auto& name : data.checked) {
    const at::Tensor& full = data.expected.at(name);
    const Tolerance tol = strategy.tolerance(name, c, full);
    at::Tensor covered = at::zeros(full.sizes(), at::kBool);
    for (int r = 0; r < n; ++r) {
      const Box box = strategy.resultBoxOf(name, c, r, full.sizes());
      sliceBox(covered, box).fill_(true);
      auto it = results[r].find(name);
      const at::Tensor actual = it == results[r].end() ? at::Tensor() : it->second;
      v.checks.push_back(checkTensor(name, r, actual, sliceBox(full, box), box.offset, tol));
    }
    const int64_t missing = full.numel() - covered.sum().item<int64_t>();
    if (missing > 0) {
      v.problems.push_back(name + ": " + std::to_string(missing) +
                           " elements are held by no rank's declared layout");
    }
  }
  return v;
}

std::string summarize(const Verification& v) {
  std::ostringstream os;
  int shown = 0;
  for (const auto& p : v.problems) os << (shown++ ? "; " : "") << p;
  for (const auto& c : v.checks) {
    if (c.passed()) continue;
    if (shown == 3) {
      os << "; ...";
      break;
    }
    os << (shown++ ? "; " : "") << c.toString();
  }
  return os.str();
}

nlohmann::json checksToJson(const Verification& v) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& c : v.checks) {
    nlohmann::json j;
    j["tensor"] = c.tensor;
    j["rank"] = c.rank;
    j["numel"] = c.numel;
    j["mismatches"] = c.mismatches;
    j["max_abs_err"] = std::isfinite(c.maxAbsErr) ? nlohmann::json(c.maxAbsErr)
                                                  : nlohmann::json(std::to_string(c.maxAbsErr));
    j["max_rel_err"] = std::isfinite(c.maxRelErr) ? nlohmann::json(c.maxRelErr)
                                                  : nlohmann::json(std::to_string(c.maxRelErr));
    j["err_ratio"] = std::isfinite(c.errRatio) ? nlohmann::json(c.errRatio)
                                               : nlohmann::json(std::to_string(c.errRatio));
    j["worst_index"] = c.worstIndex;
    j["tolerance"] = c.tolerance;
    if (!c.problem.empty()) j["problem"] = c.problem;
    arr.push_back(j);
  }
  return arr;
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

}  // namespace

double timedStep(ThreadsWorld& world, std::vector<std::unique_ptr<RankExecutor>>& execs,
                 std::vector<double>& scratch) {
  world.run([&](RankContext& ctx) {
    const auto t0 = Clock::now();
    execs[ctx.rank()]->step(ctx);
    scratch[ctx.rank()] = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  return *std::max_element(scratch.begin(), scratch.end());
}

Record baseRecord(const CaseSpec& c, const Strategy& s, const Provenance& p,
                  const std::string& backend) {
  Record r;
  r.provenance = p;
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
  if (options.backend != "threads") {
    throw InputError("backend '" + options.backend +
                     "' is not available in this build (available: threads)");
  }
  std::optional<std::regex> filter;
  if (!options.filter.empty()) {
    try {
      filter.emplace(options.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw InputError("--filter '" + options.filter +
                       "' is not a valid regular expression: " + e.what());
    }
  }
  const auto& registry = StrategyRegistry::global();
  std::vector<PlannedCase> plan;
  size_t selected = 0;
  for (CaseSpec c : suite.cases) {
    if (options.repetitions) c.repetitions = *options.repetitions;
    if (options.seed) c.seed = *options.seed;
    if (options.minTimeSec) c.minTimeSec = *options.minTimeSec;
    c.backend = options.backend;
    if (options.worldSize && c.meshSize() != *options.worldSize) {
      throw InputError(c.where() + ": case '" + c.name + "' has mesh " + c.meshString() + " (" +
                       std::to_string(c.meshSize()) + " ranks) but the world size is " +
                       std::to_string(*options.worldSize));
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
    for (const Strategy* s : chosen) {
      if (filter && !std::regex_search(s->id(), *filter)) continue;
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
  const Applicability a = strategy.applies(c);
  if (a.kind != Applicability::Kind::kApplies) {
    rec.status = Status::kUnsupported;
    rec.message = a.reason;
    return rec;
  }
  rec.details["case"] = strategy.caseDetails(c);
  {
    const std::string& first = data.checked.front();
    const Tolerance tol = strategy.tolerance(first, c, data.expected.at(first));
    rec.atol = tol.atol;
    rec.rtol = tol.rtol;
    rec.tolerance = tol.toString();
  }
  try {
    MemoryTracker::instance().install();
    const DeviceMesh mesh(c.mesh);
    const int n = mesh.size();
    ThreadsOptions topts;
    topts.timeout = options.collectiveTimeout;
    ThreadsWorld world(mesh, topts);
    std::vector<std::unique_ptr<RankExecutor>> execs(n);
    std::vector<double> stepSeconds(n, 0.0);
    std::vector<int64_t> peak(n, 0);
    std::vector<std::map<std::string, at::Tensor>> results(n);

    std::mutex unsupportedMutex;
    std::string unsupported;
    world.run([&](RankContext& ctx) {
      execs[ctx.rank()] = strategy.makeExecutor(c);
      try {
        execs[ctx.rank()]->prepare(ctx, data);
      } catch (const UnsupportedCase& e) {
        std::lock_guard<std::mutex> lock(unsupportedMutex);
        if (unsupported.empty()) unsupported = e.what();
      }
    });
    if (!unsupported.empty()) {
      rec.status = Status::kUnsupported;
      rec.message = unsupported;
      return rec;
    }
    // Warm-up: first-touch allocations and lazy initialisation stay out of the measurements.
    world.run([&](RankContext& ctx) { execs[ctx.rank()]->step(ctx); });

    // The measured step: communication counts, peak memory and the results to verify.
    world.resetStats();
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      MemoryTracker::instance().resetPeak(r);
      execs[r]->step(ctx);
      peak[r] = MemoryTracker::instance().peak(r);
      results[r] = execs[r]->results();
    });

    const Verification v = verify(c, data, strategy, results);
    rec.details["tensors"] = checksToJson(v);
    double maxAbs = 0, maxRel = 0;
    int64_t mism = 0;
    for (const auto& ch : v.checks) {
      maxAbs = std::max(maxAbs, ch.maxAbsErr);
      maxRel = std::max(maxRel, ch.maxRelErr);
      mism += ch.mismatches;
    }
    rec.maxAbsErr = maxAbs;
    rec.maxRelErr = maxRel;
    rec.mismatches = mism;
    // Per tensor, the worst rank's distance to tolerance; the record's is the worst tensor's.
    for (const auto& ch : v.checks) {
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

    // Communication: counted by the backend against the strategy's prediction, per rank.
    int64_t commMax = 0, predMax = 0, callsMax = 0;
    std::string commProblem;
    nlohmann::json commRanks = nlohmann::json::array();
    std::optional<int64_t> memPredMax;
    for (int r = 0; r < n; ++r) {
      const CommStats& counted = world.stats(r);
      const CommStats predicted = strategy.predictComm(c, r);
      commMax = std::max(commMax, counted.totalBytes());
      predMax = std::max(predMax, predicted.totalBytes());
      callsMax = std::max(callsMax, counted.totalCalls());
      commRanks.push_back(
          {{"rank", r}, {"counted", commToJson(counted)}, {"predicted", commToJson(predicted)}});
      if (!(counted == predicted) && commProblem.empty()) {
        commProblem = "rank " + std::to_string(r) + " communicated " + counted.toString() +
                      " but the strategy predicts " + predicted.toString();
      }
      auto m = execs[r]->predictedPeakBytes();
      if (!m) m = strategy.predictPeakMemory(c, r);
      if (m) memPredMax = std::max(memPredMax.value_or(0), *m);
    }
    rec.commBytes = commMax;
    rec.predictedCommBytes = predMax;
    rec.commCalls = callsMax;
    rec.details["comm_per_rank"] = commRanks;
    rec.peakMemBytes = *std::max_element(peak.begin(), peak.end());
    rec.predictedMemBytes = memPredMax;
    rec.details["peak_mem_bytes_per_rank"] = peak;
    rec.predictedTimeUs = execs[0]->predictedTimeUs();
    rec.params = execs[0]->recordParams();
    if (auto d = execs[0]->details(); !d.empty()) rec.details["executor"] = d;

    // Timing: the slowest rank's step time per iteration.
    rec.timing =
        timeWithBenchmark(c.suite + "/" + c.name + "/" + strategy.id(), c.repetitions, c.minTimeSec,
                          options.warmupSec, [&] { return timedStep(world, execs, stepSeconds); });

    // As nccl-tests does, the timed runs are verified too: the last timed step must still
    // give the reference results (catches state that leaks from step to step).
    world.run([&](RankContext& ctx) { results[ctx.rank()] = execs[ctx.rank()]->results(); });
    const Verification after = verify(c, data, strategy, results);

    if (!v.passed()) {
      rec.status = Status::kFail;
      rec.message = summarize(v);
    } else if (!after.passed()) {
      rec.status = Status::kFail;
      rec.message = "results changed during the timed steps: " + summarize(after);
    } else if (!commProblem.empty()) {
      rec.status = Status::kFail;
      rec.message = commProblem;
    } else {
      rec.status = Status::kPass;
    }
  } catch (const std::exception& e) {
    rec.status = Status::kError;
    rec.message = errorText(e);
  }
  return rec;
}

int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               std::ostream& out) {
  const Provenance prov = Provenance::collect();
  nlohmann::json runInfo = {
      {"run_id", prov.runId},       {"git_sha", prov.gitSha}, {"timestamp_utc", prov.timestampUtc},
      {"host", prov.host},          {"device", prov.device},  {"torch_version", prov.torchVersion},
      {"backend", options.backend}, {"suite", suite.name},    {"suite_file", suite.file}};
  ResultWriter writer(options.outDir, runInfo);
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
  for (size_t i = 0; i < plan.size(); ++i) {
    const CaseSpec& c = plan[i].spec;
    const auto t0 = Clock::now();
    Tally tally;
    reference::WorkloadData data;
    std::string buildError;
    try {
      data = reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
    } catch (const std::exception& e) {
      buildError = "reference failed: " + errorText(e);
    }
    for (const auto& entry : plan[i].strategies) {
      Record rec;
      if (!buildError.empty()) {
        rec = baseRecord(c, *entry.strategy, prov, options.backend);
        rec.status = Status::kError;
        rec.message = buildError;
      } else {
        rec = runStrategy(c, data, *entry.strategy, prov, options);
      }
      writer.add(rec);
      tally.add(rec.status);
      total.add(rec.status);
      if (rec.status == Status::kFail || rec.status == Status::kError) bad.push_back(rec);
    }
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
  out << "results: " << writer.csvPath() << ", " << writer.jsonPath() << " (" << std::fixed
      << std::setprecision(1) << std::chrono::duration<double>(Clock::now() - runStart).count()
      << " s)\n"
      << std::defaultfloat;
  return (total.fail + total.error) > 0 ? 1 : 0;
}

}  // namespace sb::harness
