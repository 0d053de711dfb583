// Selective checkpointing's budget solver (budget.h says what it solves and how).

#include "strategies/checkpointing/sac/budget.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "harness/comm/mesh.h"
#include "harness/comm/threads_backend.h"
#include "strategies/checkpointing/sac/sac_runtime.h"
#include "strategies/sharding/auto/ilp.h"
#include "strategies/sharding/auto/plan_memory.h"

namespace sb::strategies::sac {
namespace {

using autoshard::ShardingModel;

Policy fromKeep(const reference::Graph& g, const std::vector<int>& decisions,
                const std::vector<bool>& keep, const std::string& name) {
  std::vector<bool> rule(g.nodes.size(), true);
  for (size_t i = 0; i < decisions.size(); ++i) rule[static_cast<size_t>(decisions[i])] = keep[i];
  return makePolicy(g, name, rule);
}

}  // namespace

int64_t replayPolicyPeak(const ShardingModel& m, const std::vector<int>& choice,
                         const Policy& policy) {
  const RecomputeModel model = modelRecompute(m, choice, policy);
  autoshard::RecomputePolicy rp{policy.save, policy.region, model.heldBy};
  int64_t peak = 0;
  harness::ThreadsWorld world{harness::DeviceMesh(m.mesh())};
  world.run([&](harness::RankContext& ctx) {
    peak = autoshard::replayPlanStep(m, choice, {}, ctx, m.options().dtype, nullptr, false,
                                     nullptr, &rp);
  });
  return peak;
}

BudgetPlan solveBudget(const ShardingModel& m, const std::vector<int>& choice,
                       int64_t budgetBytes, const BudgetOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const auto& g = m.graph();
  const size_t n = g.nodes.size();
  const int64_t es = c10::elementSize(m.options().dtype);
  BudgetPlan out;
  // The decisions: a block's operators that take a gradient, views apart.
  std::vector<int> decisions;
  for (size_t v = 0; v < n; ++v) {
    const auto& node = g.nodes[v];
    const bool anyGrad = std::any_of(node.args.begin(), node.args.end(),
                                     [&](const std::string& a) { return g.requiresGrad(a); });
    if (node.layer >= 0 && anyGrad && !isViewOp(node.shape.op)) {
      decisions.push_back(static_cast<int>(v));
    }
  }
  out.decisions = static_cast<int>(decisions.size());
  // Per operator: how many nodes of its block save its outputs (through views to their maker).
  const std::vector<int> readers = blockSaveReaders(m, choice, !options.ignoreViewBase);
  std::vector<double> bytes(decisions.size()), us(decisions.size());
  for (size_t i = 0; i < decisions.size(); ++i) {
    const size_t v = static_cast<size_t>(decisions[i]);
    const auto& node = g.nodes[v];
    const auto& cand = m.candidates(static_cast<int>(v))[choice[v]];
    if (readers[v] > 0 || savesOwnTensors(node.shape.op)) {
      for (const auto& shape : node.shape.outputs()) {
        int64_t e = es;
        for (int64_t d : shape) e *= d;
        bytes[i] += static_cast<double>(e);
      }
    }
    us[i] = (isMatmulOp(node.shape.op) ? cand.computeUs / 3 : cand.computeUs / 2) +
            cand.localUs / 2;
  }
  const auto replay = [&](const Policy& p) { return replayPolicyPeak(m, choice, p); };
  const auto costOf = [&](const std::vector<bool>& keep) {
    double t = 0;
    for (size_t i = 0; i < keep.size(); ++i) t += keep[i] ? 0 : us[i];
    return t;
  };
  const std::vector<bool> none(decisions.size(), false), all(decisions.size(), true);
  out.leastPeak = replay(fromKeep(g, decisions, none, "budget"));
  out.keepAllPeak = replay(fromKeep(g, decisions, all, "budget"));

  // Greedy: recompute the most bytes per microsecond first, until the replay fits.
  std::vector<bool> greedyKeep;
  {
    std::vector<size_t> order(decisions.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return bytes[a] / (us[a] + 1e-9) > bytes[b] / (us[b] + 1e-9);
    });
    std::vector<bool> keep = all;
    int64_t peak = out.keepAllPeak;
    for (size_t k = 0; k < order.size() && peak > budgetBytes; ++k) {
      if (bytes[order[k]] <= 0) continue;
      keep[order[k]] = false;
      peak = replay(fromKeep(g, decisions, keep, "greedy"));
    }
    out.greedyFits = peak <= budgetBytes;
    out.greedyPeak = peak;
    out.greedyUs = costOf(keep);
    greedyKeep = keep;
  }

  if (out.leastPeak > budgetBytes && !options.ignoreViewBase) {
    out.status = "infeasible";
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  // The program: keep or recompute each operator, least recompute time, the kept operators'
  // bytes within an allowance. The allowance that makes the replayed peak fit is searched by
  // bisection between nothing kept (fits: checked above) and everything kept.
  // The rows: the backward of block b begins with all of b made (kept, or recomputed at its
  // first read) and the blocks before it holding what they keep; the blocks after it are done.
  // So row b = everything block b holds + what blocks < b keep, and keeping in the last blocks
  // costs least: a role kept in k blocks is kept in the last k.
  std::map<int, double> blockBytes;  // block -> the bytes its operators hold
  for (size_t i = 0; i < decisions.size(); ++i) {
    blockBytes[g.nodes[static_cast<size_t>(decisions[i])].layer] += bytes[i];
  }
  autoshard::SelectionProblem prob;
  for (const auto& [b, held] : blockBytes) {
    autoshard::SelectionProblem::MemoryRow row;
    row.what = "block " + std::to_string(b) + "'s backward begins";
    row.constant = held;
    prob.memory.push_back(row);
  }
  // The blocks repeat: a role has the same bytes and time in every block, and a program with
  // one variable per node would branch over which of the equal blocks keeps it. One variable per
  // role instead, its choice how many blocks keep it (the last ones).
  std::map<std::string, std::vector<size_t>> roles;  // role -> decisions, in layer order
  for (size_t i = 0; i < decisions.size(); ++i) {
    roles[g.nodes[static_cast<size_t>(decisions[i])].role].push_back(i);
  }
  std::vector<std::vector<size_t>> classes;  // per variable, its members in layer order
  for (auto& [role, members] : roles) {
    const double u = us[members[0]], by = bytes[members[0]];
    const bool alike = std::all_of(members.begin(), members.end(),
                                   [&](size_t i) { return us[i] == u && bytes[i] == by; });
    std::vector<std::vector<size_t>> split;
    if (alike) {
      split.push_back(members);
    } else {
      for (size_t i : members) split.push_back({i});
    }
    for (auto& cls : split) {
      std::stable_sort(cls.begin(), cls.end(), [&](size_t x, size_t y) {
        return g.nodes[static_cast<size_t>(decisions[x])].layer <
               g.nodes[static_cast<size_t>(decisions[y])].layer;
      });
      const size_t n = cls.size();
      std::vector<double> cost;
      std::vector<std::string> names;
      for (size_t k = 0; k <= n; ++k) {
        double c = 0;
        for (size_t j = 0; j < n - k; ++j) c += us[cls[j]];
        cost.push_back(c);
        names.push_back("keep in the last " + std::to_string(k));
      }
      const int var = static_cast<int>(prob.vars.size());
      prob.vars.push_back({n == 1 ? g.nodes[static_cast<size_t>(decisions[cls[0]])].name : role,
                           cost, names});
      size_t r = 0;
      for (const auto& [b, held] : blockBytes) {
        std::vector<double> kept;  // per choice: the bytes blocks before b keep of this class
        for (size_t k = 0; k <= n; ++k) {
          double sum = 0;
          for (size_t j = n - k; j < n; ++j) {
            if (g.nodes[static_cast<size_t>(decisions[cls[j]])].layer < b) sum += bytes[cls[j]];
          }
          kept.push_back(sum);
        }
        prob.memory[r++].terms.push_back({var, kept});
      }
      classes.push_back(cls);
    }
  }
  double total = 0, least = 0;
  for (const auto& [b, held] : blockBytes) least = std::max(least, held);
  for (double x : bytes) total += x;
  autoshard::SelectionOptions so;
  so.timeLimitSeconds = options.timeLimitSeconds;
  bool timed = false;
  out.policy = fromKeep(g, decisions, none, "budget");
  out.peak = out.leastPeak;
  out.recomputeUs = costOf(none);
  // A choice per class: its last `k` members kept.
  const auto keepOf = [&](const std::vector<int>& choice) {
    std::vector<bool> keep(decisions.size(), false);
    for (size_t c = 0; c < classes.size(); ++c) {
      const size_t n = classes[c].size();
      for (size_t j = n - static_cast<size_t>(choice[c]); j < n; ++j) keep[classes[c][j]] = true;
    }
    return keep;
  };
  // One plan of the program under `allowance`: its cost, and whether it fits by the replay (the
  // planted fault: by the row alone, the least peak plus the kept bytes).
  const auto tryAllowance = [&](double allowance) {
    prob.memoryLimit = std::max(allowance, 1e-9);
    ++out.rounds;
    const autoshard::Selection sel = autoshard::solveIlp(prob, so);
    if (sel.choice.empty()) return false;
    timed = timed || sel.status != "optimal";
    const std::vector<bool> keep = keepOf(sel.choice);
    Policy p = fromKeep(g, decisions, keep, "budget");
    const int64_t peak = replay(p);
    const bool fits =
        options.ignoreViewBase
            ? out.leastPeak + static_cast<int64_t>(sel.peakMemory - least) <= budgetBytes
            : peak <= budgetBytes;
    if (fits && costOf(keep) <= out.recomputeUs) {
      out.policy = std::move(p);
      out.peak = peak;
      out.recomputeUs = costOf(keep);
    }
    return fits;
  };
  if (options.ignoreViewBase) {
    // The row's bytes against the budget less what nothing-kept reaches beyond them.
    tryAllowance(static_cast<double>(budgetBytes - out.leastPeak) + least);
  } else if (!tryAllowance(total + least)) {
    double lo = least, hi = total + least;
    while (out.rounds < options.maxRounds && hi - lo > 0.5 * static_cast<double>(es)) {
      const double mid = 0.5 * (lo + hi);
      (tryAllowance(mid) ? lo : hi) = mid;
    }
  }
  // Then from the best plan, keep what it recomputes where the replay still fits, the most
  // time saved first (the rows' model of the peak errs; the replay decides).
  if (!options.ignoreViewBase && out.recomputeUs > 0) {
    std::vector<bool> keep(decisions.size(), true);
    for (size_t i = 0; i < decisions.size(); ++i) {
      keep[i] = out.policy.save[static_cast<size_t>(decisions[i])];
    }
    std::vector<size_t> order;
    for (size_t i = 0; i < keep.size(); ++i) {
      if (!keep[i] && us[i] > 0) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return us[a] > us[b]; });
    bool improved = false;
    for (size_t i : order) {
      keep[i] = true;
      Policy p = fromKeep(g, decisions, keep, "budget");
      const int64_t peak = replay(p);
      ++out.ascents;
      if (peak <= budgetBytes) {
        out.policy = std::move(p);
        out.peak = peak;
        out.recomputeUs = costOf(keep);
        improved = true;
      } else {
        keep[i] = false;
      }
    }
    if (improved) out.chosen = "program, then kept where the replay fits";
  }
  // The fastest plan that fits by the replay: the program's, or the baseline's where the
  // program's row (a model of the peak, never the peak) kept it from that one.
  if (out.greedyFits && out.greedyUs < out.recomputeUs && !options.ignoreViewBase) {
    out.policy = fromKeep(g, decisions, greedyKeep, "budget");
    out.peak = out.greedyPeak;
    out.recomputeUs = out.greedyUs;
    out.chosen = "greedy";
    timed = true;
  }
  // The program is exact on its row; the row is a model of the peak, which the search corrects
  // by the replay: the plan is the fastest found that fits, not a proven optimum, unless it
  // recomputes nothing.
  out.status = out.recomputeUs == 0 && !timed ? "optimal" : "feasible";
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace sb::strategies::sac
