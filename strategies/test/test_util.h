#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/registry.h"
#include "harness/run/runner.h"

namespace sb::strategies::test {

// A Linear case with quick timing (one short repetition): tests check numerics and counts,
// not speed.
inline harness::CaseSpec linearCase(std::vector<int64_t> input, int64_t out,
                                    std::vector<int64_t> mesh, bool exact = false) {
  harness::CaseSpec c;
  c.suite = "test";
  c.name = "test";
  c.workload = "linear";
  c.shape = {{"input", input}, {"out_features", out}, {"bias", true}};
  c.mesh = std::move(mesh);
  c.seed = 7;
  c.inputs = exact ? reference::InputMode::kExact : reference::InputMode::kRandom;
  c.repetitions = 1;
  c.minTimeSec = 1e-4;
  c.file = "test";
  return c;
}

// A single-operator case (workload op) with quick timing.
inline harness::CaseSpec opCase(nlohmann::json shape, std::vector<int64_t> mesh,
                                bool exact = false) {
  harness::CaseSpec c = linearCase({}, 0, std::move(mesh), exact);
  c.workload = "op";
  c.shape = std::move(shape);
  c.seed = 11;
  return c;
}

inline harness::Record run(const harness::CaseSpec& c, const harness::Strategy& s) {
  const auto data =
      c.training.enabled()
          ? reference::buildTraining(c.workload, c.shape, c.dtype, c.seed, c.inputs, c.training)
          : reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
  return harness::runStrategy(c, data, s, harness::Provenance{}, harness::RunOptions{});
}

// A registered strategy by id; throws if there is none.
inline const harness::Strategy& strategy(const std::string& id) {
  const harness::Strategy* s = harness::StrategyRegistry::global().find(id);
  if (!s) throw std::runtime_error("no strategy " + id);
  return *s;
}

// A record's parameter by name ("" if it has none).
inline std::string param(const harness::Record& r, const std::string& key) {
  for (const auto& [k, v] : r.params) {
    if (k == key) return v;
  }
  return "";
}

// `inner` in the hooks a test leaves alone (its per-node communication stays unpredicted, as
// a strategy's is by default): a test that plants one wrong answer (a declared layout, a
// specification, a node's communication) overrides that hook and no other.
class Delegating : public harness::Strategy {
 public:
  Delegating(const harness::Strategy& inner, std::string id, std::string displayName)
      : Strategy(std::move(id), std::move(displayName), inner.family()), inner_(inner) {}
  harness::Applicability applies(const harness::CaseSpec& c) const override {
    return inner_.applies(c);
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    return inner_.makeExecutor(c);
  }
  harness::Box resultBox(const std::string& t, const harness::CaseSpec& c, int r) const override {
    return inner_.resultBox(t, c, r);
  }
  harness::Box resultBoxOf(const std::string& t, const harness::CaseSpec& c, int r,
                           at::IntArrayRef shape) const override {
    return inner_.resultBoxOf(t, c, r, shape);
  }
  std::optional<SpecifiedBox> specifiedBox(const std::string& t, const harness::CaseSpec& c, int r,
                                           at::IntArrayRef shape) const override {
    return inner_.specifiedBox(t, c, r, shape);
  }
  harness::Tolerance tolerance(const std::string& t, const harness::CaseSpec& c,
                               const at::Tensor& e) const override {
    return inner_.tolerance(t, c, e);
  }
  harness::CommStats predictComm(const harness::CaseSpec& c, int r) const override {
    return inner_.predictComm(c, r);
  }

 protected:
  const harness::Strategy& inner_;
};

}  // namespace sb::strategies::test
