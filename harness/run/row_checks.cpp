// A row's verification helpers (see row_checks.h).

#include "harness/run/row_checks.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <sstream>

#include "harness/box.h"

namespace sb::harness {

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

nlohmann::json SpecCheck::toJson() const {
  return {{"checked", checked}, {"specs", specs}, {"problems", problems}};
}

SpecCheck specCheck(const CaseSpec& c, const reference::WorkloadData& data,
                    const Strategy& strategy, int n) {
  SpecCheck out;
  for (const auto& name : data.checked) {
    const at::IntArrayRef shape = data.expected.at(name).sizes();
    std::string first;  // the first rank's mismatch, named in full
    int differing = 0;
    for (int r = 0; r < n; ++r) {
      std::optional<Strategy::SpecifiedBox> spec;
      try {
        spec = strategy.specifiedBox(name, c, r, shape);
      } catch (const std::exception& e) {
        // A specification that cannot be read is the strategy's bug, and must not pass unseen.
        out.problems.push_back("layout: the specification of " + name + " on rank " +
                               std::to_string(r) + " could not be read: " + e.what());
        break;
      }
      if (!spec) continue;
      ++out.checked;
      if (std::find(out.specs.begin(), out.specs.end(), spec->spec) == out.specs.end()) {
        out.specs.push_back(spec->spec);
      }
      const Box declared = strategy.resultBoxOf(name, c, r, shape);
      if (declared == spec->box) continue;
      if (differing++ == 0) {
        first = "layout: " + name + " on rank " + std::to_string(r) + " is declared " +
                declared.toString() + " but the strategy's specification " + spec->spec + " puts " +
                spec->box.toString() + " there";
      }
    }
    if (differing > 1) {
      first += " (and on " + std::to_string(differing - 1) + " more rank" +
               (differing > 2 ? "s" : "") + ")";
    }
    if (differing > 0) out.problems.push_back(first);
  }
  return out;
}

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

}  // namespace sb::harness
