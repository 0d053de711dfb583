// Plan files (model.h's ShardingPlan::toJson and fromJson): a plan written as MASE exports its
// solution, and a plan read back and checked against the model's graph and mesh. Its own file:
// the reader takes untrusted input (ci/fuzz.sh's `plan` target fuzzes it).

#include "strategies/sharding/auto/model.h"

#include "harness/error.h"

namespace sb::strategies::autoshard {
namespace {

using harness::InputError;
using harness::Layout;

}  // namespace

nlohmann::json ShardingPlan::toJson(const ShardingModel& m) const {
  nlohmann::json nodes = nlohmann::json::array();
  const int meshNdim = static_cast<int>(mesh.size());
  for (size_t v = 0; v < choice.size(); ++v) {
    const auto& n = m.graph().nodes[v];
    const Candidate& c = m.candidates(v)[choice[v]];
    const auto place = [&](const Layout& l) {
      nlohmann::json j = {{"sequence", l.sequence()}};
      try {
        j["placements"] = l.dtensor(meshNdim);
      } catch (const std::exception&) {
      }
      return j;
    };
    nlohmann::json args = nlohmann::json::object(), results = nlohmann::json::object();
    for (size_t i = 0; i < n.args.size(); ++i) {
      nlohmann::json a = place(c.op.operands[i]);
      a["value"] = n.args[i];
      args[c.op.spec.operands[i]] = a;
    }
    const auto names = n.outputs();
    for (size_t j = 0; j < names.size(); ++j) results[names[j]] = place(c.outputs[j]);
    nodes.push_back({{"name", n.name},
                     {"op", n.shape.op},
                     {"strategy", c.op.spec.name},
                     {"args", args},
                     {"results", results},
                     {"cost_us", c.us()}});
  }
  return {{"format", "stratbench.sharding_plan/1"},
          {"workload", workload},
          {"shape", shape},
          {"mesh", mesh},
          {"algo", solver.algo},
          {"predicted",
           {{"step_time_us", predictedStepUs}, {"peak_bytes_per_rank", predictedPeakBytes}}},
          {"solver",
           {{"status", solver.status},
            {"objective_us", solver.objectiveUs},
            {"bound_us", solver.bound},
            {"gap", solver.gap},
            {"seconds", solver.seconds},
            {"program_seconds", solver.programSeconds},
            {"total_seconds", solver.totalSeconds},
            {"variables", solver.variables},
            {"constraints", solver.constraints},
            {"classes", solver.classes},
            {"memory_limit_bytes", solver.memoryLimit}}},
          {"nodes", nodes}};
}

ShardingPlan ShardingPlan::fromJson(const nlohmann::json& j, const ShardingModel& m,
                                    const std::string& file) {
  const auto fail = [&](const std::string& key, const std::string& what) {
    throw InputError(file + ": key '" + key + "': " + what);
  };
  if (!j.is_object())
    fail("(top level)", "a plan must be a mapping (as `stratbench solve shard` writes)");
  for (const char* k : {"workload", "mesh", "nodes"}) {
    if (!j.contains(k)) fail(k, "missing");
  }
  if (!j.at("workload").is_string() || j.at("workload").get<std::string>() != m.graph().workload) {
    fail("workload", "expected \"" + m.graph().workload + "\", got " + j.at("workload").dump());
  }
  if (j.at("mesh") != nlohmann::json(m.mesh())) {
    fail("mesh", "expected " + nlohmann::json(m.mesh()).dump() + ", got " + j.at("mesh").dump());
  }
  const auto& nodes = j.at("nodes");
  const size_t N = m.graph().nodes.size();
  if (!nodes.is_array() || nodes.size() != N) {
    fail("nodes", "expected a list of the graph's " + std::to_string(N) + " nodes");
  }
  ShardingPlan plan;
  plan.workload = m.graph().workload;
  plan.mesh = m.mesh();
  for (size_t v = 0; v < N; ++v) {
    const std::string key = "nodes[" + std::to_string(v) + "]";
    const auto& n = nodes[v];
    const auto& g = m.graph().nodes[v];
    if (!n.is_object() || !n.contains("name") || n.at("name") != g.name) {
      fail(key + ".name", "expected \"" + g.name + "\"");
    }
    if (!n.contains("strategy") || !n.at("strategy").is_string())
      fail(key + ".strategy", "missing");
    const int k = m.findCandidate(static_cast<int>(v), n.at("strategy").get<std::string>());
    if (k < 0) {
      fail(key + ".strategy",
           "node " + g.name + " has no strategy " + n.at("strategy").dump() + " on this mesh");
    }
    const Candidate& c = m.candidates(v)[k];
    if (n.contains("args")) {
      for (size_t i = 0; i < c.op.spec.operands.size(); ++i) {
        const std::string& op = c.op.spec.operands[i];
        if (!n.at("args").contains(op)) continue;
        const auto& a = n.at("args").at(op);
        if (!a.contains("sequence") || a.at("sequence") != c.op.operands[i].sequence()) {
          fail(key + ".args." + op + ".sequence",
               "strategy " + c.op.spec.name + " reads it as " + c.op.operands[i].sequence());
        }
      }
    }
    plan.choice.push_back(k);
  }
  plan.shape = j.value("shape", nlohmann::json());
  plan.solver.algo = "file";
  plan.solver.status = j.contains("solver") ? j.at("solver").value("status", "") : "";
  plan.predictedStepUs = m.stepUs(plan.choice);
  plan.predictedPeakBytes = m.peakBytes(plan.choice);
  return plan;
}

}  // namespace sb::strategies::autoshard
