// A row's record (see compose.h), and the record every row starts from.

#include "harness/run/compose.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "harness/measure/device.h"
#include "harness/run/divergence.h"
#include "harness/run/predict.h"
#include "harness/run/row_checks.h"
#include "harness/run/runner.h"

namespace sb::harness {

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

namespace {

// One rank's communication per node and phase, counted beside predicted (where the strategy
// predicts per node), in the step's order (the counted nodes first, then any predicted but never
// reached); `problem` names the first node whose two differ.
nlohmann::json nodeCommEntries(const std::vector<NodeComm>& counted,
                               const std::optional<std::vector<NodeComm>>& predicted,
                               std::string& problem) {
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, std::pair<CommStats, CommStats>> at;
  const auto note = [&](const NodeComm& n, bool isCounted) {
    const auto key = std::make_pair(n.node, n.phase);
    auto [it, fresh] = at.try_emplace(key);
    if (fresh) order.push_back(key);
    (isCounted ? it->second.first : it->second.second) += n.comm;
  };
  for (const auto& n : counted) note(n, true);
  if (predicted) {
    for (const auto& n : *predicted) note(n, false);
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& key : order) {
    const auto& [c, p] = at.at(key);
    if (c.totalCalls() == 0 && p.totalCalls() == 0) continue;
    nlohmann::json e = {{"node", key.first}, {"phase", key.second}, {"counted", commToJson(c)}};
    if (predicted) e["predicted"] = commToJson(p);
    out.push_back(e);
    if (predicted && !(c == p) && problem.empty()) {
      problem = "at node " + (key.first.empty() ? std::string("(outside the nodes)") : key.first) +
                " (" + key.second + ") it communicated " + c.toString() +
                " but the strategy predicts " + p.toString() + " there";
    }
  }
  return out;
}

}  // namespace

Record compose(Record rec, const CaseSpec& c, const reference::WorkloadData& data,
               const Strategy& strategy, const std::vector<RankOutcome>& ranks,
               const LocalRun& rank0, bool perRankErrors, const CostProfile* profile) {
  rec.details["case"] = strategy.caseDetails(c);
  {
    const std::string& first = data.checked.front();
    const Tolerance tol = rowTolerance(c, data, strategy, first);
    rec.atol = tol.atol;
    rec.rtol = tol.rtol;
    rec.tolerance = tol.toString();
  }
  // The reference's own rounding (what tolerances were raised to), or why it was not measured.
  if (!data.rounding.empty()) {
    rec.details["reference_rounding"] = data.rounding;
  } else if (!data.roundingNote.empty()) {
    rec.details["reference_rounding"] = data.roundingNote;
  }
  if (const auto low = strategy.arithmeticDtype(c)) {
    if (auto in = data.roundingIn.find(*low); in != data.roundingIn.end()) {
      rec.details["reference_rounding_in"] = {{c10::toString(*low), in->second}};
    }
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
  std::vector<std::string> problems = coverageProblems(c, data, strategy, n);
  // The declared layout against the strategy's specification: a wrong layout computed
  // consistently passes every tensor check, so it fails the row here.
  const SpecCheck spec = specCheck(c, data, strategy, n);
  if (spec.checked > 0 || !spec.problems.empty()) rec.details["spec_check"] = spec.toJson();
  problems.insert(problems.end(), spec.problems.begin(), spec.problems.end());
  const ReplicaCheck replicas = replicaCheck(data, ranks);
  if (replicas.checked > 0) rec.details["replica_check"] = replicas.toJson();
  if (!replicas.problems.empty()) problems.push_back(replicas.summary());
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
  nlohmann::json commRanks = nlohmann::json::array(), nodeRanks = nlohmann::json::array();
  std::optional<int64_t> memPredMax;
  std::vector<int64_t> peaks, starts, memLimits, memPredicted;
  std::string memProblem, leakProblem;
  nlohmann::json liveAfterSteps = nlohmann::json::array();
  for (const auto& o : ranks) {
    const CommStats predicted = strategy.predictComm(c, o.rank);
    commMax = std::max(commMax, o.counted.totalBytes());
    predMax = std::max(predMax, predicted.totalBytes());
    callsMax = std::max(callsMax, o.counted.totalCalls());
    nlohmann::json entry = {
        {"rank", o.rank}, {"counted", commToJson(o.counted)}, {"predicted", commToJson(predicted)}};
    if (!(o.wire == o.counted)) entry["wire"] = commToJson(o.wire);
    commRanks.push_back(entry);
    // Per node and phase: where a strategy predicts them, a collective at the wrong node fails
    // the row even where the totals agree.
    const auto predictedByNode = strategy.predictCommByNode(c, o.rank);
    std::string nodeProblem;
    nlohmann::json nodes = nodeCommEntries(o.counted.byNode, predictedByNode, nodeProblem);
    if (!nodes.empty()) {
      nodeRanks.push_back({{"rank", o.rank},
                           {"predicted_per_node", predictedByNode.has_value()},
                           {"nodes", std::move(nodes)}});
    }
    if (!strategy.judgesComm(c)) {
      // A comparison, not a model (strategy.h): whether they agree is kept with the rank's.
      commRanks.back()["matches_prediction"] = o.counted == predicted;
    } else if (commProblem.empty() && !(o.counted == predicted)) {
      commProblem = "rank " + std::to_string(o.rank) + " communicated " + o.counted.toString() +
                    " but the strategy predicts " + predicted.toString() +
                    (nodeProblem.empty() ? "" : "; first " + nodeProblem);
    } else if (commProblem.empty() && !nodeProblem.empty()) {
      commProblem = "rank " + std::to_string(o.rank) + ": the totals agree, but " + nodeProblem;
    }
    if (o.predictedPeak) {
      memPredMax = std::max(memPredMax.value_or(0), *o.predictedPeak);
      memPredicted.push_back(*o.predictedPeak);
    }
    peaks.push_back(o.peak);
    starts.push_back(o.startBytes);
    if (o.memoryLimit && o.peak > *o.memoryLimit && memProblem.empty()) {
      memProblem = "rank " + std::to_string(o.rank) + " peaked at " + std::to_string(o.peak) +
                   " bytes, over the " + std::to_string(*o.memoryLimit) +
                   " bytes it promised to stay within (its budget, limit or modelled peak)";
    }
    if (o.memoryLimit) memLimits.push_back(*o.memoryLimit);
    // The measured step runs after the warm-up step and every timed step after a step, the
    // runner holding nothing of the step's between them, then the same results: what is live
    // after a step is the same each time unless the step leaks.
    const auto leaked = [&](int64_t before, int64_t after, const std::string& when) {
      if (after == before || !leakProblem.empty()) return;
      const int64_t grew = after - before;
      leakProblem =
          "rank " + std::to_string(o.rank) + " held " + std::to_string(std::abs(grew)) + " bytes " +
          (grew > 0 ? "more" : "less") + " after " + when + " (" + std::to_string(before) + " -> " +
          std::to_string(after) + " bytes): a step " +
          (grew > 0 ? "leaves what it allocated live (a leak)" : "frees what an earlier step left");
    };
    nlohmann::json live = {{"rank", o.rank}};
    if (o.endBytes >= 0) {
      live["after_warm_up"] = o.startBytes;
      live["after_measured"] = o.endBytes;
      leaked(o.startBytes, o.endBytes, "the measured step than after the warm-up step");
    }
    if (o.timedSteps >= 2) {
      live["timed_steps"] = o.timedSteps;
      live["after_first_timed"] = o.afterFirstTimedBytes;
      live["after_last_timed"] = o.afterLastTimedBytes;
      leaked(o.afterFirstTimedBytes, o.afterLastTimedBytes,
             "the last of " + std::to_string(o.timedSteps) + " timed steps than after the first");
    }
    if (live.size() > 1) liveAfterSteps.push_back(live);
  }
  if (!liveAfterSteps.empty()) rec.details["live_after_steps"] = liveAfterSteps;
  if (!memLimits.empty()) rec.details["memory_limit_bytes_per_rank"] = memLimits;
  rec.commBytes = commMax;
  rec.predictedCommBytes = predMax;
  rec.commCalls = callsMax;
  rec.details["comm_per_rank"] = commRanks;
  if (!nodeRanks.empty()) rec.details["comm_by_node"] = nodeRanks;
  rec.peakMemBytes = *std::max_element(peaks.begin(), peaks.end());
  rec.predictedMemBytes = memPredMax;
  rec.details["peak_mem_bytes_per_rank"] = peaks;
  // What was live when the measured step started: the peak's baseline (parameters, inputs,
  // what the executor holds), so that a step's own bytes are peak - start.
  rec.details["step_start_bytes_per_rank"] = starts;
  // Each rank's prediction beside its peak, where every rank has one (ranks differ: a causal
  // ring's ranks see different blocks).
  if (memPredicted.size() == peaks.size()) {
    rec.details["predicted_peak_mem_bytes_per_rank"] = memPredicted;
  }
  rec.predictedTimeUs = rank0.predictedTimeUs;
  if (!rec.predictedTimeUs && profile) predictTime(rec, c, strategy, n, *profile);
  rec.params = rank0.params;
  if (!rank0.executorDetails.empty()) rec.details["executor"] = rank0.executorDetails;
  if (!rank0.deviceMemory.is_null()) rec.details["cuda_allocator"] = rank0.deviceMemory;
  if (rank0.timing) rec.timing = *rank0.timing;
  const std::string mispredicted = judgePredictions(rec, strategy.casePredictionTolerance(c));

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
  } else if (!leakProblem.empty()) {
    rec.status = Status::kFail;
    rec.message = leakProblem;
  } else {
    rec.status = Status::kPass;
  }
  // Where the step first left the reference, where it was captured (a failing row's tensors,
  // or `run --capture`): named in the message of a row that failed its tensors.
  std::vector<nlohmann::json> located;
  for (const auto& o : ranks) located.push_back(o.divergence);
  nlohmann::json d = firstDivergence(located);
  if (const std::string node = strategy.singleNode(c); d.is_null() && !node.empty()) {
    d = singleNodeDivergence(node, allPassed(checks, {}) ? after : checks);
  }
  if (!d.is_null()) {
    rec.details["first_divergence"] = d;
    if (rec.status == Status::kFail && (!allPassed(checks, {}) || !allPassed(after, {}))) {
      rec.message += "; " + divergenceText(d);
    }
  }
  // A row that failed its tensors may have communicated otherwise than predicted as well:
  // said after them (the node where the counts part names the place to look).
  if (!commProblem.empty() && rec.message != commProblem) {
    rec.message += "; communication: " + commProblem;
  }
  if (!mispredicted.empty()) {
    rec.message += (rec.message.empty() ? "" : "; ") + mispredicted;
  }
  return rec;
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

}  // namespace sb::harness
