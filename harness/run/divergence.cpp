// First divergence (see divergence.h).

#include "harness/run/divergence.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <ATen/ATen.h>

#include "harness/run/rank_outcome.h"
#include "harness/run/run_util.h"

namespace sb::harness {
namespace {

// A captured piece and its slice of the reference in terms checkTensor judges. Intermediate
// values are not all gradients and outputs: masks and indices (bool, integer) compare exactly;
// a score masked with -inf (or a NaN) on both sides matches there, and the tolerance's scale is
// taken from the finite values (an infinite max|reference| would allow anything).
std::tuple<at::Tensor, at::Tensor, Tolerance> comparable(const CaseSpec& c,
                                                         const Strategy& strategy,
                                                         const TraceValue& ref,
                                                         const TraceValue& got) {
  at::Tensor expected = sliceBox(ref.value, got.box), actual = got.value;
  if (!at::isFloatingType(ref.value.scalar_type())) {
    if (actual.scalar_type() == expected.scalar_type()) {
      actual = actual.to(at::kDouble);
      expected = expected.to(at::kDouble);
    }
    return {actual, expected, Tolerance::bitwise("a mask or index: compared exactly")};
  }
  // Where both sides hold the same infinity (a masked score) or both a NaN (a fully masked
  // row's softmax), they match: zeroed on both sides before the check.
  const at::Tensor finite = at::isfinite(ref.value);
  if (finite.all().item<bool>()) {
    return {actual, expected, strategy.tolerance(ref.tensor, c, ref.value)};
  }
  const Tolerance tol =
      strategy.tolerance(ref.tensor, c, at::where(finite, ref.value, at::zeros_like(ref.value)));
  if (actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type()) {
    const at::Tensor same = at::isinf(expected)
                                .logical_and(actual.eq(expected))
                                .logical_or(at::isnan(expected).logical_and(at::isnan(actual)));
    actual = at::where(same, at::zeros_like(actual), actual);
    expected = at::where(same, at::zeros_like(expected), expected);
  }
  return {actual, expected, tol};
}

}  // namespace

nlohmann::json firstDivergenceOnRank(const CaseSpec& c, const Strategy& strategy,
                                     const std::vector<TraceValue>& reference,
                                     const std::vector<TraceValue>& captured, int rank) {
  std::map<std::string, const TraceValue*> expected;
  for (const auto& v : reference) expected[v.key()] = &v;
  std::map<std::string, bool> seen;
  int compared = 0, untraced = 0;
  nlohmann::json found;
  for (size_t i = 0; i < captured.size() && found.is_null(); ++i) {
    const TraceValue& got = captured[i];
    auto it = expected.find(got.key());
    // A recomputation must give the forward's value again.
    if (it == expected.end() && got.phase == "recompute")
      it = expected.find("forward|" + got.tensor);
    if (it == expected.end()) {
      ++untraced;
      continue;
    }
    const TraceValue& ref = *it->second;
    seen[ref.key()] = true;
    ++compared;
    TensorCheck check;
    if (got.box.offset.size() != static_cast<size_t>(ref.value.dim())) {
      check.tensor = ref.tensor;
      check.rank = rank;
      check.problem = "captured at " + got.box.toString() + ", a box of " +
                      std::to_string(got.box.offset.size()) + " dimensions, but the value has " +
                      std::to_string(ref.value.dim());
    } else {
      const auto [actual, want, tol] = comparable(c, strategy, ref, got);
      check = checkTensor(ref.tensor, rank, actual, want, got.box.offset, tol);
    }
    if (check.passed()) continue;
    found = {{"found", true},
             {"node", ref.node},
             {"phase", got.phase},
             {"tensor", ref.tensor},
             {"rank", rank},
             {"box", got.box.toString()},
             {"index", i},
             {"of", captured.size()},
             {"at_ns", got.atNs},
             {"compared", compared},
             {"check", checkToJson(check)}};
  }
  nlohmann::json j = found.is_null() ? nlohmann::json{{"found", false},
                                                      {"rank", rank},
                                                      {"compared", compared},
                                                      {"of", captured.size()}}
                                     : found;
  // What the reference traces and this rank never made, and what it made that is not traced:
  // both say the capture and the reference disagree on names, not that the values do.
  if (found.is_null()) {
    // By their place in the reference (alike on every process), so that what no rank made can
    // be told from what another rank made (a pipeline's stages).
    std::vector<size_t> missing;
    for (size_t k = 0; k < reference.size(); ++k) {
      if (!seen.count(reference[k].key())) missing.push_back(k);
    }
    if (!missing.empty()) j["missing"] = missing;
  }
  if (untraced) j["untraced"] = untraced;
  return j;
}

nlohmann::json firstDivergence(const std::vector<nlohmann::json>& perRank) {
  const nlohmann::json* best = nullptr;
  const nlohmann::json* error = nullptr;
  const nlohmann::json* clean = nullptr;
  for (const auto& d : perRank) {
    if (d.is_null()) continue;
    if (d.contains("error")) {
      if (!error) error = &d;
      continue;
    }
    if (!d.value("found", false)) {
      if (!clean) clean = &d;
      continue;
    }
    const auto at = [](const nlohmann::json& x) {
      return std::make_pair(x.at("at_ns").get<int64_t>(), x.at("rank").get<int>());
    };
    if (!best || at(d) < at(*best)) best = &d;
  }
  if (!best) {
    if (error) return *error;
    if (!clean) return nullptr;
    nlohmann::json out = {{"found", false}};
    int64_t compared = 0, untraced = 0;
    std::optional<std::set<size_t>> missing;  // made by no rank
    for (const auto& d : perRank) {
      if (d.is_null() || d.contains("error")) continue;
      compared += d.value("compared", 0);
      untraced += d.value("untraced", 0);
      std::set<size_t> mine;
      if (d.contains("missing")) mine = d.at("missing").get<std::set<size_t>>();
      if (!missing) {
        missing = mine;
      } else {
        std::set<size_t> both;
        std::set_intersection(missing->begin(), missing->end(), mine.begin(), mine.end(),
                              std::inserter(both, both.begin()));
        missing = both;
      }
    }
    // Over every rank.
    out["compared"] = compared;
    if (missing && !missing->empty()) out["missing"] = missing->size();
    if (untraced) out["untraced"] = untraced;
    return out;
  }
  // The earliest in time; shown on the lowest rank whose first divergence is the same value
  // (SPMD ranks that go wrong together do so at the same value, in an order of no meaning).
  const std::string key =
      best->at("phase").get<std::string>() + "|" + best->at("tensor").get<std::string>();
  const auto sameValue = [&](const nlohmann::json& d) {
    return !d.is_null() && !d.contains("error") && d.value("found", false) &&
           d.at("phase").get<std::string>() + "|" + d.at("tensor").get<std::string>() == key;
  };
  std::vector<int> same;
  for (const auto& d : perRank) {
    if (sameValue(d) && d.at("rank").get<int>() < best->at("rank").get<int>()) best = &d;
  }
  nlohmann::json out = *best;
  nlohmann::json elsewhere = nlohmann::json::array();
  for (const auto& d : perRank) {
    if (sameValue(d)) {
      same.push_back(d.at("rank").get<int>());
    } else if (!d.is_null() && !d.contains("error") && d.value("found", false)) {
      elsewhere.push_back({{"rank", d.at("rank")},
                           {"node", d.at("node")},
                           {"phase", d.at("phase")},
                           {"tensor", d.at("tensor")},
                           {"index", d.at("index")}});
    }
  }
  std::sort(same.begin(), same.end());
  out["ranks"] = same;
  if (!elsewhere.empty()) out["elsewhere"] = elsewhere;
  return out;
}

nlohmann::json singleNodeDivergence(const std::string& node,
                                    const std::vector<TensorCheck>& checks) {
  // The forward's results first: a wrong output makes every gradient after it wrong too.
  const auto backward = [](const std::string& t) {
    return t.rfind("grad", 0) == 0 || t.rfind("param/", 0) == 0 || t.rfind("state/", 0) == 0;
  };
  const TensorCheck* first = nullptr;
  for (const auto& ch : checks) {
    if (ch.passed()) continue;
    if (!first || (backward(first->tensor) && !backward(ch.tensor))) first = &ch;
  }
  if (!first) return nullptr;
  std::vector<int> ranks;
  for (const auto& ch : checks) {
    if (!ch.passed() && ch.tensor == first->tensor) ranks.push_back(ch.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return {{"found", true},
          {"node", node},
          {"phase", backward(first->tensor) ? "backward" : "forward"},
          {"tensor", first->tensor},
          {"rank", ranks.front()},
          {"ranks", ranks},
          {"from", "the row's results: the step is one node"},
          {"check", checkToJson(*first)}};
}

std::string divergenceText(const nlohmann::json& d) {
  if (d.is_null()) return "";
  if (d.contains("error"))
    return "first divergence not located: " + d.at("error").get<std::string>();
  if (!d.value("found", false)) {
    return "no traced value leaves its tolerance (" + std::to_string(d.value("compared", 0)) +
           " compared over the ranks): the divergence is outside the captured step's traced values "
           "(an optimizer update, a later step, or what is not traced)";
  }
  const TensorCheck check = checkFromJson(d.at("check"));
  std::string ranks;
  if (d.contains("ranks") && d.at("ranks").size() > 1) {
    ranks = " (also rank";
    ranks += d.at("ranks").size() > 2 ? "s" : "";
    bool first = true;
    for (const auto& r : d.at("ranks")) {
      if (r.get<int>() == d.at("rank").get<int>()) continue;
      ranks += (first ? " " : ", ") + std::to_string(r.get<int>());
      first = false;
    }
    ranks += ")";
  }
  const std::string where = d.contains("index")
                                ? ", value " + std::to_string(d.at("index").get<int64_t>() + 1) +
                                      " of " + std::to_string(d.at("of").get<int64_t>())
                                : " (the step's one node)";
  return "first divergence: node " + d.at("node").get<std::string>() + " (" +
         d.at("phase").get<std::string>() + ") on rank " + std::to_string(d.at("rank").get<int>()) +
         ranks + where + ": " + check.toString();
}

bool captureDivergence(World& world, const CaseSpec& c, const reference::WorkloadData& data,
                       const Strategy& strategy, std::vector<std::unique_ptr<RankExecutor>>& execs,
                       const std::vector<int>& slot, LocalRun& out) {
  const std::vector<int> local = world.localRanks();
  std::vector<std::vector<TraceValue>> captured(execs.size());
  std::vector<std::string> errors(execs.size());
  try {
    world.run([&](RankContext& ctx) {
      const int r = ctx.rank();
      try {
        execs[r]->setCapture(true);
        execs[r]->step(ctx);
        captured[r] = execs[r]->captured();
      } catch (...) {
        execs[r]->setCapture(false);
        throw;  // the world aborts: no peer waits in a collective this rank never reaches
      }
      execs[r]->setCapture(false);
    });
  } catch (const std::exception& e) {
    for (int r : local) {
      out.ranks[slot[r]].divergence = {{"error", "capturing: " + errorText(e)}, {"rank", r}};
    }
    return false;
  }
  std::vector<TraceValue> reference;
  std::string refError;
  try {
    reference = strategy.referenceTrace(c, data);
  } catch (const std::exception& e) {
    refError = "the reference's trace: " + errorText(e);
  }
  for (int r : local) {
    RankOutcome& o = out.ranks[slot[r]];
    if (!refError.empty() || !errors[r].empty()) {
      o.divergence = {{"error", refError.empty() ? errors[r] : refError}, {"rank", r}};
      continue;
    }
    if (reference.empty()) continue;
    try {
      o.divergence = firstDivergenceOnRank(c, strategy, reference, captured[r], r);
    } catch (const std::exception& e) {
      o.divergence = {{"error", "comparing: " + errorText(e)}, {"rank", r}};
    }
  }
  return true;
}

}  // namespace sb::harness
