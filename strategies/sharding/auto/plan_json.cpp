// Plan files (model.h's ShardingPlan::toJson and fromJson): a plan written as MASE exports its
// solution, and a plan read back and checked against the model's graph and mesh. Its own file:
// the reader takes untrusted input (ci/fuzz.sh's `plan` target fuzzes it).

#include "strategies/sharding/auto/model.h"

#include <algorithm>
#include <sstream>

#include "harness/error.h"
#include "reference/graph.h"
#include "reference/torchscript/import.h"

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
      // ZeRO-3: a parameter stored split further than it is read, gathered at use.
      if (c.stored.count(i)) a["stored"] = place(c.stored.at(i));
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
           {{"step_time_us", predictedStepUs},
            {"peak_bytes_per_rank", predictedPeakBytes},
            {"peak_bytes_by_rank", replayedPeakBytes},
            {"memory_model",
             replayedPeakBytes.empty() ? "liveness rows: " + notReplayed : std::string("replay")},
            {"liveness_peak_bytes", livenessPeakBytes}}},
          {"solver",
           {{"status", solver.status},
            {"objective_us", solver.objectiveUs},
            {"bound_us", solver.bound},
            {"gap", solver.gap},
            {"seconds", solver.seconds},
            {"program_seconds", solver.programSeconds},
            {"replay_seconds", solver.replaySeconds},
            {"rounds", solver.rounds},
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
  if (j.contains("format") && j.at("format") != "stratbench.sharding_plan/1") {
    fail("format", "expected \"stratbench.sharding_plan/1\", got " + j.at("format").dump());
  }
  // The shape the plan was solved for: a plan for d_model 32 has the same nodes as one for
  // d_model 64, but its layouts, costs and memory are another model's.
  if (!j.contains("shape")) fail("shape", "missing (the model shape the plan was solved for)");
  if (m.graph().workload == "torchscript") {
    // An imported model's shape is its file and its inputs: the nodes below check that the
    // graph is the plan's (names and operators, node by node); the inputs' shapes, which fold
    // into the graph's constants, and the parameters' source must be the case's.
    reference::torchscript::ImportSpec planSpec, caseSpec;
    try {
      planSpec = reference::torchscript::ImportSpec::fromJson(j.at("shape"));
    } catch (const std::exception& e) {
      fail("shape", e.what());
    }
    caseSpec = reference::torchscript::ImportSpec::fromJson(m.graph().importShape);
    const auto inputs = [](const reference::torchscript::ImportSpec& s) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& in : s.inputs) a.push_back(in.toJson());
      return a;
    };
    if (inputs(planSpec) != inputs(caseSpec)) {
      fail("shape.inputs", "the plan was solved for inputs " + inputs(planSpec).dump() +
                               ", the case has " + inputs(caseSpec).dump() +
                               " (a plan is for one model shape: solve it again)");
    }
    if (planSpec.seededParams != caseSpec.seededParams ||
        planSpec.microbatches != caseSpec.microbatches) {
      fail("shape", "the plan was solved for " + j.at("shape").dump() + ", the case has " +
                        m.graph().importShape.dump() + " (params and microbatches must agree)");
    }
  } else {
    reference::GraphShape planShape;
    try {
      planShape = reference::GraphShape::parse(m.graph().workload, j.at("shape"));
    } catch (const std::exception& e) {
      fail("shape", e.what());
    }
    const reference::GraphShape& caseShape = m.graph().shape;
    const std::pair<const char*, std::pair<double, double>> fields[] = {
        {"batch", {double(planShape.batch), double(caseShape.batch)}},
        {"seq", {double(planShape.seq), double(caseShape.seq)}},
        {"d_model", {double(planShape.dModel), double(caseShape.dModel)}},
        {"heads", {double(planShape.heads), double(caseShape.heads)}},
        {"layers", {double(planShape.layers), double(caseShape.layers)}},
        {"vocab", {double(planShape.vocab), double(caseShape.vocab)}},
        {"dropout", {planShape.dropout, caseShape.dropout}}};
    for (const auto& [name, values] : fields) {
      if (values.first != values.second) {
        std::ostringstream os;
        os << "the plan was solved for " << name << " " << values.first << ", the case has "
           << values.second << " (a plan is for one model shape: solve it again)";
        fail(std::string("shape.") + name, os.str());
      }
    }
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
    if (n.contains("op") && n.at("op") != g.shape.op) {
      fail(key + ".op", "node " + g.name + " is " + g.shape.op + ", not " + n.at("op").dump());
    }
    // Everything else a node says is what its strategy implies on this mesh: a layout, a value
    // or a placement edited by hand would not change the run, so it is refused, not ignored.
    const int meshNdim = static_cast<int>(m.mesh().size());
    const auto checkPlacement = [&](const std::string& where, const nlohmann::json& p,
                                    const Layout& l, const std::string& what) {
      if (!p.is_object()) fail(where, "expected a mapping with its sequence");
      for (const auto& [field, value] : p.items()) {
        const bool known = field == "sequence" || field == "placements" ||
                           ((field == "value" || field == "stored") && what == "reads it as");
        if (!known) fail(where + "." + field, "unknown field");
      }
      if (!p.contains("sequence") || p.at("sequence") != l.sequence()) {
        fail(where + ".sequence", "strategy " + c.op.spec.name + " " + what + " " + l.sequence());
      }
      if (p.contains("placements")) {
        std::string dtensor;
        try {
          dtensor = l.dtensor(meshNdim);
        } catch (const std::exception&) {
          fail(where + ".placements", "strategy " + c.op.spec.name + " " + what + " " +
                                          l.sequence() + ", which DTensor cannot spell");
        }
        if (p.at("placements") != dtensor) {
          fail(where + ".placements", "strategy " + c.op.spec.name + " " + what + " " + dtensor);
        }
      }
    };
    if (n.contains("args")) {
      const auto& args = n.at("args");
      if (!args.is_object()) fail(key + ".args", "expected a mapping of the operands");
      for (const auto& [name, a] : args.items()) {
        const auto& ops = c.op.spec.operands;
        if (std::find(ops.begin(), ops.end(), name) == ops.end()) {
          fail(key + ".args." + name,
               "node " + g.name + " (" + g.shape.op + ") has no operand '" + name + "'");
        }
      }
      for (size_t i = 0; i < c.op.spec.operands.size(); ++i) {
        const std::string& op = c.op.spec.operands[i];
        const std::string where = key + ".args." + op;
        if (!args.contains(op)) fail(where, "missing: every operand of the node is listed");
        const auto& a = args.at(op);
        checkPlacement(where, a, c.op.operands[i], "reads it as");
        if (a.contains("value") && a.at("value") != g.args[i]) {
          fail(where + ".value", "node " + g.name + " reads \"" + g.args[i] + "\" there");
        }
        // A parameter stored split further (ZeRO-3): said by the strategy's name, so listed
        // exactly where the strategy stores it so.
        if (a.contains("stored") != (c.stored.count(i) > 0)) {
          fail(where + ".stored", c.stored.count(i)
                                      ? "missing: strategy " + c.op.spec.name + " stores it as " +
                                            c.stored.at(i).sequence()
                                      : "strategy " + c.op.spec.name + " stores it as it reads it");
        }
        if (a.contains("stored")) {
          checkPlacement(where + ".stored", a.at("stored"), c.stored.at(i), "stores it as");
        }
      }
    }
    if (n.contains("results")) {
      const auto& results = n.at("results");
      const auto names = g.outputs();
      if (!results.is_object()) fail(key + ".results", "expected a mapping of the outputs");
      for (const auto& [name, r] : results.items()) {
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          fail(key + ".results." + name, "node " + g.name + " has no output '" + name + "'");
        }
      }
      for (size_t o = 0; o < names.size(); ++o) {
        const std::string where = key + ".results." + names[o];
        if (!results.contains(names[o])) fail(where, "missing: every output of the node is listed");
        checkPlacement(where, results.at(names[o]), c.outputs[o], "leaves it as");
      }
    }
    plan.choice.push_back(k);
  }
  plan.shape = j.value("shape", nlohmann::json());
  plan.solver.algo = "file";
  plan.solver.status = j.contains("solver") ? j.at("solver").value("status", "") : "";
  plan.predictedStepUs = m.stepUs(plan.choice);
  plan.predictMemory(m);
  return plan;
}

}  // namespace sb::strategies::autoshard
