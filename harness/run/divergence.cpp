// First divergence (see divergence.h).

#include "harness/run/divergence.h"

#include <map>
#include <tuple>

#include <ATen/ATen.h>

#include "harness/run/rank_outcome.h"
#include "harness/run/run_util.h"

namespace sb::harness {
namespace {

// A captured piece and its slice of the reference in terms checkTensor judges. Intermediate
// values are not all gradients and outputs: masks and indices (bool, integer) compare exactly;
// a score masked with -inf on both sides matches there, and the tolerance's scale is taken from
// the finite values (an infinite max|reference| would allow anything).
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
  const at::Tensor finite = at::isfinite(ref.value);
  if (finite.all().item<bool>()) {
    return {actual, expected, strategy.tolerance(ref.tensor, c, ref.value)};
  }
  const Tolerance tol =
      strategy.tolerance(ref.tensor, c, at::where(finite, ref.value, at::zeros_like(ref.value)));
  if (actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type()) {
    const at::Tensor same = at::isinf(expected).logical_and(actual.eq(expected));
    actual = at::where(same, at::zeros_like(actual), actual);
    expected = at::where(same, at::zeros_like(expected), expected);
  }
  return {actual, expected, tol};
}

}  // namespace

nlohmann::json firstDivergenceOnRank(const CaseSpec& c, const Strategy& strategy,
                                     const std::vector<TraceValue>& reference,
                                     const std::vector<TraceValue>& captured, int rank) {
  std::map<std::string, const TraceValue*> pieces;
  for (const auto& v : captured) pieces[v.key()] = &v;
  int compared = 0, missing = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const TraceValue& ref = reference[i];
    auto it = pieces.find(ref.key());
    if (it == pieces.end()) {
      ++missing;
      continue;
    }
    const TraceValue& got = *it->second;
    ++compared;
    TensorCheck check;
    if (got.box.offset.size() != static_cast<size_t>(ref.value.dim())) {
      check.tensor = ref.tensor;
      check.rank = rank;
      check.problem = "captured at " + got.box.toString() + ", a box of " +
                      std::to_string(got.box.offset.size()) + " dimensions, but the value has " +
                      std::to_string(ref.value.dim());
    } else {
      const auto [actual, expected, tol] = comparable(c, strategy, ref, got);
      check = checkTensor(ref.tensor, rank, actual, expected, got.box.offset, tol);
    }
    if (check.passed()) continue;
    nlohmann::json j = {{"found", true},        {"node", ref.node},
                        {"phase", ref.phase},   {"tensor", ref.tensor},
                        {"rank", rank},         {"box", got.box.toString()},
                        {"index", i},           {"of", reference.size()},
                        {"compared", compared}, {"check", checkToJson(check)}};
    if (missing) j["missing"] = missing;
    return j;
  }
  nlohmann::json j = {
      {"found", false}, {"rank", rank}, {"compared", compared}, {"of", reference.size()}};
  if (missing) j["missing"] = missing;
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
      return std::make_pair(x.at("index").get<int64_t>(), x.at("rank").get<int>());
    };
    if (!best || at(d) < at(*best)) best = &d;
  }
  if (!best) {
    if (error) return *error;
    if (!clean) return nullptr;
    nlohmann::json out = {{"found", false}, {"of", clean->at("of")}};
    int64_t compared = 0;
    for (const auto& d : perRank) {
      if (!d.is_null() && !d.contains("error")) compared += d.value("compared", 0);
    }
    out["compared"] = compared;  // over every rank
    return out;
  }
  nlohmann::json out = *best;
  std::vector<int> same;
  nlohmann::json elsewhere = nlohmann::json::array();
  for (const auto& d : perRank) {
    if (d.is_null() || d.contains("error") || !d.value("found", false)) continue;
    if (d.at("index") == best->at("index")) {
      same.push_back(d.at("rank").get<int>());
    } else {
      elsewhere.push_back({{"rank", d.at("rank")},
                           {"node", d.at("node")},
                           {"phase", d.at("phase")},
                           {"tensor", d.at("tensor")},
                           {"index", d.at("index")}});
    }
  }
  out["ranks"] = same;
  if (!elsewhere.empty()) out["elsewhere"] = elsewhere;
  return out;
}

std::string divergenceText(const nlohmann::json& d) {
  if (d.is_null()) return "";
  if (d.contains("error"))
    return "first divergence not located: " + d.at("error").get<std::string>();
  if (!d.value("found", false)) {
    return "no intermediate value leaves its tolerance (" + std::to_string(d.value("compared", 0)) +
           " compared over the ranks): the divergence is outside the traced nodes";
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
  return "first divergence: node " + d.at("node").get<std::string>() + " (" +
         d.at("phase").get<std::string>() + ") on rank " + std::to_string(d.at("rank").get<int>()) +
         ranks + ", value " + std::to_string(d.at("index").get<int64_t>() + 1) + " of " +
         std::to_string(d.at("of").get<int64_t>()) + ": " + check.toString();
}

void captureDivergence(World& world, const CaseSpec& c, const reference::WorkloadData& data,
                       const Strategy& strategy, std::vector<std::unique_ptr<RankExecutor>>& execs,
                       const std::vector<int>& slot, LocalRun& out) {
  const std::vector<int> local = world.localRanks();
  std::vector<std::vector<TraceValue>> captured(execs.size());
  std::vector<std::string> errors(execs.size());
  world.run([&](RankContext& ctx) {
    const int r = ctx.rank();
    try {
      execs[r]->setCapture(true);
      execs[r]->step(ctx);
      captured[r] = execs[r]->captured();
    } catch (const std::exception& e) {
      errors[r] = "capturing: " + errorText(e);
    }
    execs[r]->setCapture(false);
  });
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
}

}  // namespace sb::harness
