// The plan algorithms of auto-sharding (model.h's solvePlan): Alpa's integer program, and the
// hand-written families (Megatron, data parallel, replicated) solved as the same program over
// the candidates they allow. Its own file: the baselines' rules, apart from the model they
// choose in.

#include "strategies/sharding/auto/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "harness/error.h"
#include "strategies/sharding/auto/model_internal.h"

namespace sb::strategies::autoshard {
namespace {

using harness::InputError;
using harness::Layout;

// Which candidates a hand-written plan family allows (the solver picks the rest).
using Allowed = std::function<bool(int node, const Candidate&)>;

bool onlyDimZero(const Layout& l, int axis) {
  for (int d = 1; d < l.ndim(); ++d) {
    const auto& a = l.axesOf(d);
    if (axis < 0 ? !a.empty() : std::find(a.begin(), a.end(), axis) != a.end()) return false;
  }
  return true;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Megatron-LM's placement of a parameter: column-parallel query, key, value and MLP input
// projections (their output features split over the tensor-parallel axis), row-parallel output
// projections (their input features split), a vocabulary-parallel embedding and head; the rest
// replicated.
Layout megatronParam(const std::string& name, int ndim, int tp) {
  const auto split = [&](int dim) {
    std::vector<std::vector<int>> d(ndim);
    d[dim] = {tp};
    return Layout(d, {});
  };
  for (const char* col : {"attn.q.", "attn.k.", "attn.v.", "mlp.fc.", "mlp.gate.", "mlp.up."}) {
    if (name.find(col) != std::string::npos) return split(ndim - 1);
  }
  if (endsWith(name, "attn.proj.weight") || endsWith(name, "mlp.proj.weight") ||
      endsWith(name, "mlp.down.weight")) {
    return split(0);
  }
  if (name == "wte") return split(0);
  if (name == "lm_head.weight") return split(ndim - 1);  // an untied head: its vocabulary
  if (name == "lm_head.bias") return split(0);
  return Layout(ndim);
}

Allowed allowedFor(const ShardingModel& m, const std::string& algo, int tpAxis) {
  const reference::Graph& g = m.graph();
  const int meshNdim = static_cast<int>(m.mesh().size());
  if (algo == "replicated") {
    return [](int, const Candidate& c) { return allReplicated(c.op) && c.stored.empty(); };
  }
  if (algo == "data-parallel") {
    // Every parameter replicated, and every node that computes on data (reads an activation or
    // looks up ids) splits its work over every mesh axis: its outputs use them all, along the
    // batch, the sequence or the batched heads, since a replicated weight allows no other.
    std::vector<int> axes;
    for (int a = 0; a < meshNdim; ++a) {
      if (m.mesh()[a] > 1) axes.push_back(a);
    }
    return [&g, axes](int v, const Candidate& c) {
      const auto& n = g.nodes[v];
      if (!c.stored.empty()) return false;  // every parameter whole on every rank
      // An imported operator without a strategy set runs whole on every rank in any plan, and
      // the views of what it returns may stay whole too (they compute nothing; a view's
      // strategies need not cover every rank of input an imported model reshapes through).
      if (n.shape.op == "aten") return true;
      const std::string& op = n.shape.op;
      if (g.workload == "torchscript" && allReplicated(c.op) &&
          (op == "view" || op == "reshape" || op == "permute" || op == "transpose" ||
           op == "split" || op == "getitem")) {
        return true;
      }
      bool data = false;
      for (size_t i = 0; i < n.args.size(); ++i) {
        const Layout& l = c.op.operands[i];
        if (g.isParameter(n.args[i]) && l != Layout(l.ndim())) return false;
        data |= !g.isParameter(n.args[i]);
      }
      for (const auto& l : c.outputs) {
        if (!data) {
          if (l != Layout(l.ndim())) return false;  // a parameter's view stays replicated
          continue;
        }
        for (int a : axes) {
          if (l.shardDimOf(a) < 0) return false;
        }
      }
      return true;
    };
  }
  // megatron: tensor parallel over one mesh axis (the last unless told), data parallel over the
  // others (a 1-D mesh is all tensor parallel)
  const int tp = tpAxis < 0 ? meshNdim - 1 : tpAxis;
  std::vector<int> dp;
  for (int a = 0; a < meshNdim; ++a) {
    if (a != tp) dp.push_back(a);
  }
  return [&g, tp, dp](int v, const Candidate& c) {
    const auto& n = g.nodes[v];
    if (!c.stored.empty()) return false;  // Megatron's parameters are stored as they are read
    const auto activationOk = [&](const Layout& l) {
      for (int a : dp) {
        if (!onlyDimZero(l, a)) return false;
      }
      // Tokens ([T, features]) are not split over the tensor-parallel axis: no sequence
      // parallelism in this plan.
      if (l.ndim() == 2) {
        const auto& a = l.axesOf(0);
        if (std::find(a.begin(), a.end(), tp) != a.end()) return false;
      }
      return true;
    };
    for (size_t i = 0; i < n.args.size(); ++i) {
      const Layout& l = c.op.operands[i];
      if (g.isParameter(n.args[i])) {
        if (l != megatronParam(n.args[i], l.ndim(), tp)) return false;
      } else if (!g.isInput(n.args[i]) && !activationOk(l)) {
        return false;
      }
    }
    for (const auto& l : c.outputs) {
      if (!activationOk(l)) return false;
    }
    return true;
  };
}

}  // namespace

const std::vector<std::string>& planAlgos() {
  static const std::vector<std::string> a = {"ilp", "megatron", "data-parallel", "replicated"};
  return a;
}

namespace {
ShardingPlan solveProgram(const ShardingModel& m, const SolveOptions& o);
}  // namespace

ShardingPlan solvePlan(const ShardingModel& m, const SolveOptions& o) {
  if (!m.recomputePricing() || !(o.memoryLimit > 0) || o.algo != "ilp") return solveProgram(m, o);
  try {
    return solveProgram(m, o);
  } catch (const NoPlanError& priced) {
    // Under a policy the rows are a rougher estimate of the replay (a block's recomputation is
    // priced at its largest): where they admit no plan, the plan the unpriced program finds
    // under the limit, replayed with the policy (which keeps no more than the plain step), may
    // still fit.
    ShardingModel plain = m;
    plain.priceRecompute(nullptr);
    ShardingPlan q;
    try {
      q = solveProgram(plain, o);
    } catch (const NoPlanError&) {
      throw priced;
    }
    q.predictMemory(m);
    if (q.replayedPeakBytes.empty() || q.predictedPeakBytes > o.memoryLimit) throw priced;
    q.predictedStepUs = m.stepUs(q.choice);
    q.solver.status += " (the unpriced program's plan, replayed with the policy)";
    return q;
  }
}

namespace {

ShardingPlan solveProgram(const ShardingModel& m, const SolveOptions& o) {
  const auto& algos = planAlgos();
  if (std::find(algos.begin(), algos.end(), o.algo) == algos.end()) {
    throw InputError("--algo '" + o.algo +
                     "' is not one of ilp, megatron, data-parallel, replicated");
  }
  const int meshNdim = static_cast<int>(m.mesh().size());
  if (o.tpAxis >= meshNdim || (o.tpAxis >= 0 && o.algo != "megatron")) {
    throw InputError(o.algo != "megatron"
                         ? "the tensor-parallel axis is Megatron's placement's alone (--algo "
                           "megatron), not " +
                               o.algo + "'s"
                         : "the tensor-parallel axis " + std::to_string(o.tpAxis) +
                               " is not an axis of the " + std::to_string(meshNdim) +
                               "-D mesh (0 to " + std::to_string(meshNdim - 1) + ")");
  }
  if (o.algo == "megatron" && m.graph().workload == "torchscript") {
    // Megatron's plan places parameters by their role (megatronParam), known by the names of
    // the built-in graphs; an imported model's names are its author's.
    throw NoPlanError(
        "megatron: the column- and row-parallel roles of an imported model's parameters are "
        "not recognised from their names; plan it with ilp, data-parallel or replicated",
        0);
  }
  const auto start = std::chrono::steady_clock::now();
  // A hand-written family's plan does not bend to the memory limit: it is solved without one
  // and checked against it below.
  ShardingModel::Program p = m.program(o.algo == "ilp" ? o.memoryLimit : 0);
  // Every cost within range before anything is barred or solved: a bandwidth or a profile out
  // of any real range prices a choice at 1e300 us, which CBC asserts on instead of solving.
  double costCeiling = 0;  // the dearest plan's cost: each var's and edge's dearest, summed
  for (size_t c = 0; c < p.problem.vars.size(); ++c) {
    double dearest = 0;
    for (double cost : p.problem.vars[c].cost) {
      if (!(cost <= kMaxChoiceCostUs)) {
        throw InputError(p.problem.vars[c].name + ": a choice is priced at " +
                         std::to_string(cost) + " us, over " + std::to_string(kMaxChoiceCostUs) +
                         " us: the bandwidths or the cost profile are out of any real range");
      }
      dearest = std::max(dearest, cost);
    }
    costCeiling += dearest;
  }
  for (const auto& e : p.problem.edges) {
    double dearest = 0;
    for (const auto& row : e.cost) {
      for (double cost : row) {
        if (std::isinf(cost)) continue;  // a forbidden pair
        if (!(cost <= kMaxChoiceCostUs)) {
          throw InputError("a resharding is priced at " + std::to_string(cost) + " us, over " +
                           std::to_string(kMaxChoiceCostUs) +
                           " us: the bandwidths or the cost profile are out of any real range");
        }
        dearest = std::max(dearest, cost);
      }
    }
    costCeiling += dearest;
  }
  // A hand-written family: the program over the candidates it allows (the others priced out
  // of reach: each barred choice costs more than the dearest plan of allowed ones, so that
  // the solver takes one only where no plan of the family exists), so that its activations
  // take their cheapest layouts. Which choices are barred is kept, not read back from the
  // objective: a real plan may cost more than any fixed threshold.
  const double barCost = 2 * costCeiling + 1;
  std::vector<std::vector<bool>> barred(p.problem.vars.size());
  for (size_t c = 0; c < p.problem.vars.size(); ++c) {
    barred[c].assign(p.problem.vars[c].cost.size(), false);
  }
  if (o.algo != "ilp") {
    const Allowed allowed = allowedFor(m, o.algo, o.tpAxis);
    for (size_t v = 0; v < m.graph().nodes.size(); ++v) {
      const size_t cls = static_cast<size_t>(p.classOf[v]);
      auto& cost = p.problem.vars[cls].cost;
      bool any = false;
      for (size_t k = 0; k < cost.size(); ++k) {
        if (!allowed(static_cast<int>(v), m.candidates(v)[p.memberChoice[v][k]])) {
          if (!barred[cls][k]) cost[k] += barCost;
          barred[cls][k] = true;
        } else {
          any = true;
        }
      }
      if (!any) {
        throw NoPlanError(o.algo + ": node " + m.graph().nodes[v].name + " (" +
                              m.graph().nodes[v].shape.toString() +
                              ") has no strategy of that plan on this mesh",
                          0);
      }
    }
  }
  SelectionOptions so;
  so.timeLimitSeconds = o.timeLimitSeconds;
  so.relativeGap = o.relativeGap;
  ShardingPlan plan;
  plan.workload = m.graph().workload;
  plan.mesh = m.mesh();
  // Under a memory limit the plan's peak is checked by the replay of its step (plan_memory.h),
  // which the program's liveness rows only estimate. Where the ILP's plan does not fit by it,
  // the program is solved again under a limit tightened by what its rows missed of that plan,
  // a few rounds at most: a plan returned fits by the replay, or there is none.
  constexpr int kRounds = 6;
  // Under a limit a plan fits by the replay of its step alone: the rows' estimate, where a
  // step cannot be replayed, promises nothing.
  const auto fitsByReplay = [&](const ShardingPlan& q) {
    return !q.replayedPeakBytes.empty() && q.predictedPeakBytes <= o.memoryLimit;
  };
  std::optional<ShardingPlan> fallback;  // a plan that fits by the replay, once one is known
  bool loosened = false;
  const auto anyBarred = [&](const Selection& sel) {
    for (size_t c = 0; c < sel.choice.size() && c < barred.size(); ++c) {
      if (barred[c][static_cast<size_t>(sel.choice[c])]) return true;
    }
    return false;
  };
  // The fastest plan with no limit, where it fits the limit by the replay of its step: the
  // answer under any limit it meets (the rows, an estimate, may put it above the limit).
  // The plan of least memory by the program's rows (barred choices made too big), and its
  // replay: once.
  std::optional<std::pair<Selection, ShardingPlan>> leastCache;
  const auto leastMemory = [&]() -> const std::pair<Selection, ShardingPlan>& {
    if (!leastCache) {
      SelectionProblem free = p.problem;
      free.memoryLimit = 0;
      SelectionProblem::MemoryRow barredRow;
      barredRow.what = "choices outside " + o.algo;
      for (size_t c = 0; c < free.vars.size(); ++c) {
        std::vector<double> b;
        for (size_t k = 0; k < free.vars[c].cost.size(); ++k) {
          b.push_back(barred[c][k] ? 1e18 : 0);
        }
        barredRow.terms.emplace_back(static_cast<int>(c), b);
      }
      free.memory.push_back(barredRow);
      Selection least = solveMinPeakMemory(free, so);
      ShardingPlan leastPlan = plan;
      if (!anyBarred(least)) {
        leastPlan.choice = m.planOf(p, least.choice);
        leastPlan.predictMemory(m);
        leastPlan.solver.algo = o.algo;
        leastPlan.solver.status = "least memory";
        leastPlan.solver.memoryLimit = o.memoryLimit;
        leastPlan.predictedStepUs = m.stepUs(leastPlan.choice);
      } else {
        leastPlan.predictedPeakBytes = std::numeric_limits<int64_t>::max();
      }
      leastCache.emplace(std::move(least), std::move(leastPlan));
    }
    return *leastCache;
  };
  // A plan of the program's selection, with the solver's record of it.
  const auto takeSelection = [&](ShardingPlan& q, const Selection& sel) {
    q.choice = m.planOf(p, sel.choice);
    q.solver.algo = o.algo;
    q.solver.status = sel.status;
    q.solver.objectiveUs = sel.objective;
    q.solver.bound = sel.bound;
    q.solver.gap = sel.gap;
    q.solver.seconds += sel.seconds;
    q.solver.variables = sel.variables;
    q.solver.constraints = sel.constraints;
    q.solver.classes = static_cast<int>(p.problem.vars.size());
    q.solver.memoryLimit = o.memoryLimit;
    q.predictedStepUs = m.stepUs(q.choice);
  };
  const auto unlimitedIfItFits = [&]() -> std::optional<ShardingPlan> {
    SelectionProblem unlimited = p.problem;
    unlimited.memoryLimit = 0;
    const Selection sel = solveIlp(unlimited, so);
    if ((sel.status != "optimal" && sel.status != "feasible") || anyBarred(sel)) return {};
    ShardingPlan fast = plan;
    takeSelection(fast, sel);
    fast.predictMemory(m);
    if (!fitsByReplay(fast)) return {};
    return fast;
  };
  // Where the program's rounds end without a plan that fits by the replay: one known to fit,
  // the fastest without a limit if it fits, or the plan of least memory if it does.
  const auto anyThatFits = [&]() -> std::optional<ShardingPlan> {
    // A hand-written family's plan does not bend to the limit: its one plan fits or not.
    if (o.algo != "ilp") return {};
    if (fallback) return fallback;
    if (auto fast = unlimitedIfItFits()) return fast;
    if (o.memoryLimit > 0 && fitsByReplay(leastMemory().second)) {
      return leastMemory().second;
    }
    return {};
  };
  for (int round = 0;; ++round) {
    Selection sel = solveIlp(p.problem, so);
    bool choseBarred = false;
    for (size_t c = 0; c < sel.choice.size() && c < barred.size(); ++c) {
      choseBarred |= barred[c][static_cast<size_t>(sel.choice[c])];
    }
    if (round > 0 && (sel.status == "infeasible" || choseBarred)) {
      if (auto fits = anyThatFits()) return *fits;
      throw NoPlanError(o.algo + ": found no plan that fits " +
                            std::to_string(static_cast<int64_t>(o.memoryLimit)) +
                            " bytes per rank by the replay of its step: the integer program's "
                            "rows (an estimate) admit none under it that does; the last it "
                            "offered needs " +
                            std::to_string(plan.predictedPeakBytes) +
                            " bytes, the plan of least memory needs " +
                            std::to_string(leastMemory().second.predictedPeakBytes) +
                            " bytes by the replay of its step",
                        static_cast<double>(leastMemory().second.predictedPeakBytes));
    }
    if (sel.status == "infeasible" || sel.status == "no_solution" || choseBarred) {
      if (sel.status == "no_solution") {
        throw NoPlanError(o.algo + ": CBC found no plan within --time-limit " +
                              std::to_string(o.timeLimitSeconds) + " s; give it longer",
                          0);
      }
      const Selection& least = leastMemory().first;
      if (!(o.memoryLimit > 0)) {
        throw NoPlanError(o.algo + ": no plan of it exists on this mesh (every plan needs a " +
                              "choice outside " + o.algo + ")",
                          least.peakMemory);
      }
      // The rows are an estimate of the replay, above it where they price an operator
      // conservatively (an imported `aten` node as saving all it reads). The limit is a
      // promise on the replay: the plan of least memory by the rows is replayed, and where it
      // fits, the rows' limit is loosened by what they over-count of it, once, so that the
      // program may look for a faster plan that fits by the replay too; failing that, that
      // plan is the answer.
      if (!loosened) {
        if (auto fast = unlimitedIfItFits()) return *fast;
      }
      const ShardingPlan& leastPlan = leastMemory().second;
      const double leastRows = peakMemory(p.problem, least.choice);
      if (fitsByReplay(leastPlan)) {
        fallback = leastPlan;
        if (!loosened && leastRows > o.memoryLimit) {
          loosened = true;
          p.problem.memoryLimit =
              o.memoryLimit + (leastRows - static_cast<double>(leastPlan.predictedPeakBytes));
          continue;
        }
        return *fallback;
      }
      throw NoPlanError(o.algo + ": no plan fits " +
                            std::to_string(static_cast<int64_t>(o.memoryLimit)) +
                            " bytes per rank; the plan of least memory needs " +
                            std::to_string(leastPlan.predictedPeakBytes) +
                            " bytes by the replay of its step",
                        static_cast<double>(leastPlan.predictedPeakBytes));
    }
    takeSelection(plan, sel);
    plan.solver.rounds = round + 1;
    const auto replayStart = std::chrono::steady_clock::now();
    plan.predictMemory(m);
    plan.solver.replaySeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - replayStart).count();
    if (!(o.memoryLimit > 0) || fitsByReplay(plan)) break;
    if (plan.replayedPeakBytes.empty()) {
      // Its step cannot be replayed (a rule's allocations unknown for one of its layouts): its
      // peak is the rows' estimate, which is no promise. A plan that fits by its replay, or
      // none.
      if (auto fits = anyThatFits()) return *fits;
      throw NoPlanError(o.algo + ": no plan known to fit " +
                            std::to_string(static_cast<int64_t>(o.memoryLimit)) +
                            " bytes per rank: the program's plan cannot be replayed (" +
                            plan.notReplayed + "), and neither the fastest plan nor the plan "
                            "of least memory fits by its replay",
                        static_cast<double>(plan.predictedPeakBytes));
    }
    const double rows = peakMemory(p.problem, sel.choice);
    const double next =
        std::min(p.problem.memoryLimit - 1,
                 o.memoryLimit - (static_cast<double>(plan.predictedPeakBytes) - rows));
    if (o.algo != "ilp" || round + 1 >= kRounds || !(next > 0)) {
      if (auto fits = anyThatFits()) return *fits;
      throw NoPlanError(
          o.algo + ": no plan fits " + std::to_string(static_cast<int64_t>(o.memoryLimit)) +
              " bytes per rank; its plan needs " + std::to_string(plan.predictedPeakBytes) +
              " bytes" + (plan.replayedPeakBytes.empty() ? "" : " by the replay of its step") +
              ", the plan of least memory needs " +
              std::to_string(leastMemory().second.predictedPeakBytes) + " bytes",
          static_cast<double>(plan.predictedPeakBytes));
    }
    p.problem.memoryLimit = next;
  }
  plan.solver.programSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
      plan.solver.seconds - plan.solver.replaySeconds;
  return plan;
}

}  // namespace
}  // namespace sb::strategies::autoshard
