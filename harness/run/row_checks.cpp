// A row's verification helpers (see row_checks.h).

#include "harness/run/row_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include "harness/box.h"
#include "harness/run/run_util.h"

namespace sb::harness {

namespace {
// A float64 shadow whose output or gradient norm is this far (relative to its largest value)
// from the reference is not the same computation.
constexpr double kShadowMismatch = 0.25;

at::Tensor asDouble(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); }

}  // namespace

std::map<std::string, double> roundingAgainst(const reference::WorkloadData& computed,
                                              const reference::WorkloadData& shadow,
                                              std::string* note) {
  std::map<std::string, double> out;
  for (const auto& name : computed.checked) {
    const at::Tensor& r = computed.expected.at(name);
    auto it = shadow.expected.find(name);
    if (!r.defined() || !at::isFloatingType(r.scalar_type()) || r.numel() == 0) continue;
    if (it == shadow.expected.end() || !it->second.defined() || it->second.sizes() != r.sizes()) {
      continue;
    }
    const at::Tensor a = asDouble(r), x = asDouble(it->second);
    if (!at::isfinite(x).all().item<bool>()) continue;
    const double err = (a - x).abs().max().item<double>();
    // Rounding moves an ill-conditioned model's outputs by percents (batch norm over a few
    // values, a ReLU's sign flipped); a shadow a quarter off is another computation.
    const bool decides = name == "output" || name.rfind("output/", 0) == 0 || name == "grad_norm";
    if (decides) {
      const double scale = x.abs().max().item<double>();
      if (err > kShadowMismatch * scale) {
        std::ostringstream os;
        os << "no float64 shadow: its '" << name << "' differs from the reference in "
           << r.scalar_type() << " by " << err / std::max(scale, 1e-300)
           << " of its largest value, more than rounding moves it (the reference's own rounding "
              "not measured)";
        *note = os.str();
        return {};
      }
    }
    out[name] = err;
  }
  return out;
}

void measureReferenceRounding(reference::WorkloadData& data,
                              const reference::WorkloadData& shadow) {
  data.rounding.clear();
  for (const auto& [name, t] : data.inputs) {
    if (!t.defined()) continue;
    auto it = shadow.inputs.find(name);
    if (it == shadow.inputs.end() || !it->second.defined() || it->second.sizes() != t.sizes() ||
        (at::isFloatingType(t.scalar_type()) != at::isFloatingType(it->second.scalar_type())) ||
        !at::equal(asDouble(t), asDouble(it->second))) {
      data.roundingNote = "no float64 shadow: its input '" + name +
                          "' is not the case's value (the reference's own rounding not measured)";
      return;
    }
  }
  data.roundingNote.clear();
  data.rounding = roundingAgainst(data, shadow, &data.roundingNote);
}

void measureCaseRounding(reference::WorkloadData& data, const CaseSpec& c,
                         const std::vector<const Strategy*>& strategies,
                         const std::function<reference::WorkloadData(at::ScalarType)>& build,
                         bool onDevice) {
  static const bool off = [] {
    const char* v = std::getenv("SB_REFERENCE_ROUNDING");
    return v != nullptr && std::string(v) == "off";
  }();
  if (off || !at::isFloatingType(c.dtype) || c.dtype == at::kDouble) return;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  const at::Tensor cpuState = cpu.get_state();
  std::optional<at::Generator> device;
  at::Tensor deviceState;
  if (onDevice) {
    device = at::globalContext().defaultGenerator(reference::caseDevice());
    deviceState = device->get_state();
  }
  const auto restore = [&] {
    cpu.set_state(cpuState);
    if (device) device->set_state(deviceState);
  };
  try {
    reference::ValuesRoundedAs rounded(c.dtype);
    const reference::WorkloadData shadow = build(at::kDouble);
    measureReferenceRounding(data, shadow);
    for (const Strategy* strategy : strategies) {
      const auto low = strategy->arithmeticDtype(c);
      if (!low || *low == c.dtype || data.roundingIn.count(*low) || !data.roundingNote.empty()) {
        continue;
      }
      std::string anotherComputation;  // why it is empty, where it is: not recorded
      try {
        data.roundingIn[*low] = roundingAgainst(build(*low), shadow, &anotherComputation);
      } catch (const std::exception&) {
        data.roundingIn[*low] = {};
      }
      restore();
    }
  } catch (const std::exception& e) {
    data.rounding.clear();
    data.roundingIn.clear();
    data.roundingNote =
        "no float64 shadow (the reference's own rounding not measured): " + errorText(e);
  }
  restore();
}

Tolerance rowTolerance(const CaseSpec& c, const reference::WorkloadData& data,
                       const Strategy& strategy, const std::string& name) {
  Tolerance tol = strategy.tolerance(name, c, data.expected.at(name));
  double err = -1;
  if (auto it = data.rounding.find(name); it != data.rounding.end()) err = it->second;
  // A strategy computing in a lower dtype than the case's: the reference's rounding in that one.
  if (const auto low = strategy.arithmeticDtype(c)) {
    if (auto in = data.roundingIn.find(*low); in != data.roundingIn.end()) {
      if (auto it = in->second.find(name); it != in->second.end()) {
        err = std::max(err, it->second);
      }
    }
  }
  return withReferenceRounding(tol, err);
}

std::vector<TensorCheck> verifyRank(const CaseSpec& c, const reference::WorkloadData& data,
                                    const Strategy& strategy, int rank,
                                    const std::map<std::string, at::Tensor>& results) {
  std::vector<TensorCheck> checks;
  for (const auto& name : data.checked) {
    const at::Tensor& full = data.expected.at(name);
    const Tolerance tol = rowTolerance(c, data, strategy, name);
    const Box box = strategy.resultBoxOf(name, c, rank, full.sizes());
    auto it = results.find(name);
    at::Tensor actual = it == results.end() ? at::Tensor() : it->second;
    const at::Tensor expected = sliceBox(full, box);
    // A piece boxed in a view of the tensor (a strided shard) is held in the tensor's own
    // dimensions: compared in the view's, where the box and the worst index are.
    if (!box.view.empty() && actual.defined() &&
        actual.sizes() == at::IntArrayRef(box.heldShape(full.sizes()))) {
      actual = actual.reshape(expected.sizes());
    }
    checks.push_back(checkTensor(name, rank, actual, expected, box.offset, tol));
  }
  return checks;
}

std::map<std::string, std::string> resultDigests(const CaseSpec& c,
                                                 const reference::WorkloadData& data,
                                                 const Strategy& strategy, int rank,
                                                 const std::map<std::string, at::Tensor>& results) {
  std::map<std::string, std::string> out;
  for (const auto& name : data.checked) {
    auto it = results.find(name);
    if (it == results.end() || !it->second.defined()) continue;
    const at::Tensor t = it->second.detach().cpu().contiguous();
    uint64_t h = 1469598103934665603ULL;  // FNV-1a, 64 bits
    const auto mix = [&h](const unsigned char* p, size_t n) {
      for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
    };
    const std::string type = c10::toString(t.scalar_type());
    mix(reinterpret_cast<const unsigned char*>(type.data()), type.size());
    for (int64_t d : t.sizes()) mix(reinterpret_cast<const unsigned char*>(&d), sizeof d);
    mix(static_cast<const unsigned char*>(t.data_ptr()), t.nbytes());
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    const Box box = strategy.resultBoxOf(name, c, rank, data.expected.at(name).sizes());
    out[name] = box.toString() + " " + hex;
  }
  return out;
}

ReplicaCheck replicaCheck(const reference::WorkloadData& data,
                          const std::vector<RankOutcome>& ranks) {
  ReplicaCheck out;
  for (const auto& name : data.checked) {
    // Ranks by the box they declare; the first rank of each box is the copy the others match.
    std::map<std::string, std::pair<int, std::string>> first;  // box -> (rank, hash)
    std::map<std::string, int> holders;
    std::string problem;
    int differing = 0;
    for (const auto& o : ranks) {
      auto it = o.digests.find(name);
      if (it == o.digests.end()) continue;
      const size_t cut = it->second.rfind(' ');
      const std::string box = it->second.substr(0, cut), hash = it->second.substr(cut + 1);
      if (++holders[box] == 2) ++out.checked;
      auto [f, inserted] = first.emplace(box, std::make_pair(o.rank, hash));
      if (inserted || f->second.second == hash) continue;
      if (differing++ == 0) {
        problem = "replicas: " + name + " " + box + " on rank " + std::to_string(o.rank) +
                  " is not bit-identical to rank " + std::to_string(f->second.first) + "'s copy";
      }
    }
    if (differing > 1) {
      problem += " (and on " + std::to_string(differing - 1) + " more rank" +
                 (differing > 2 ? "s" : "") + ")";
    }
    if (differing > 0) out.problems.push_back(problem);
  }
  return out;
}

std::string ReplicaCheck::summary() const {
  if (problems.empty()) return "";
  if (problems.size() == 1) return problems.front();
  return problems.front() + " (and " + std::to_string(problems.size() - 1) + " more tensor" +
         (problems.size() > 2 ? "s" : "") + " whose copies differ)";
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
