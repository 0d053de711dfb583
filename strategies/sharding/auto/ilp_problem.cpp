// The selection problem of ilp.h itself, apart from any solver: its checks (validate), the
// value and peak of a choice (evaluate, peakMemory) and the brute force the tests hold CBC's
// answers against. No CBC here.

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "strategies/sharding/auto/ilp.h"
#include "strategies/sharding/auto/ilp_internal.h"

namespace sb::strategies::autoshard {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int choiceCount(const SelectionProblem& problem, int v) {
  return static_cast<int>(problem.vars[v].cost.size());
}

namespace {

std::string varLabel(const SelectionProblem& problem, int v) {
  std::string label = "var " + std::to_string(v);
  if (!problem.vars[v].name.empty()) label += " (" + problem.vars[v].name + ")";
  return label;
}

std::string rowLabel(const SelectionProblem& problem, int r) {
  std::string label = "memory row " + std::to_string(r);
  if (!problem.memory[r].what.empty()) label += " (" + problem.memory[r].what + ")";
  return label;
}

[[noreturn]] void invalid(const std::string& what) {
  throw std::invalid_argument("SelectionProblem: " + what);
}

void checkChoice(const SelectionProblem& problem, const std::vector<int>& choice) {
  if (choice.size() != problem.vars.size()) {
    invalid("choice has " + std::to_string(choice.size()) + " entries for " +
            std::to_string(problem.vars.size()) + " vars");
  }
  for (size_t v = 0; v < choice.size(); ++v) {
    if (choice[v] < 0 || choice[v] >= choiceCount(problem, v)) {
      invalid("choice " + std::to_string(choice[v]) + " of " + varLabel(problem, v) +
              " is out of range [0, " + std::to_string(choiceCount(problem, v)) + ")");
    }
  }
}

// A matrix over the choices of vars u (rows) and v (columns), `what` naming it in errors: its
// vars in range, its size theirs, no NaN, and +infinity only where `infinityAllowed` (an
// edge's forbidden pair), never -infinity.
void checkPairMatrix(const SelectionProblem& problem, const std::string& label,
                     const std::string& what, int u, int v,
                     const std::vector<std::vector<double>>& m, bool infinityAllowed) {
  const int vars = static_cast<int>(problem.vars.size());
  for (const int end : {u, v}) {
    if (end < 0 || end >= vars) {
      invalid(label + ": var index " + std::to_string(end) + " is out of range [0, " +
              std::to_string(vars) + ")");
    }
  }
  if (static_cast<int>(m.size()) != choiceCount(problem, u)) {
    invalid(label + ": " + what + " has " + std::to_string(m.size()) + " rows, " +
            varLabel(problem, u) + " has " + std::to_string(choiceCount(problem, u)) + " choices");
  }
  for (size_t k = 0; k < m.size(); ++k) {
    if (static_cast<int>(m[k].size()) != choiceCount(problem, v)) {
      invalid(label + ": " + what + " row " + std::to_string(k) + " has " +
              std::to_string(m[k].size()) + " entries, " + varLabel(problem, v) + " has " +
              std::to_string(choiceCount(problem, v)) + " choices");
    }
    for (size_t l = 0; l < m[k].size(); ++l) {
      const double x = m[k][l];
      if (std::isnan(x) || x == -kInf || (x == kInf && !infinityAllowed)) {
        invalid(label + ": " + what + "[" + std::to_string(k) + "][" + std::to_string(l) + "] is " +
                std::to_string(x) +
                (infinityAllowed ? " (finite or +infinity expected)" : ", not finite"));
      }
    }
  }
}

}  // namespace

double objectiveOf(const SelectionProblem& problem, const std::vector<int>& choice) {
  double total = 0;
  for (size_t v = 0; v < problem.vars.size(); ++v) total += problem.vars[v].cost[choice[v]];
  for (const auto& edge : problem.edges) total += edge.cost[choice[edge.u]][choice[edge.v]];
  return total;
}

double peakOf(const SelectionProblem& problem, const std::vector<int>& choice) {
  double peak = problem.memory.empty() ? 0 : -kInf;
  for (const auto& row : problem.memory) {
    double bytes = row.constant;
    for (const auto& [v, perChoice] : row.terms) bytes += perChoice[choice[v]];
    for (const auto& pair : row.pairs) {
      // A var paired with itself takes its diagonal.
      bytes += pair.bytes[choice[pair.u]][choice[pair.v]];
    }
    peak = std::max(peak, bytes);
  }
  return peak;
}

double evaluate(const SelectionProblem& problem, const std::vector<int>& choice) {
  validate(problem);
  checkChoice(problem, choice);
  return objectiveOf(problem, choice);
}

double peakMemory(const SelectionProblem& problem, const std::vector<int>& choice) {
  validate(problem);
  checkChoice(problem, choice);
  return peakOf(problem, choice);
}

void validate(const SelectionProblem& problem) {
  const int vars = static_cast<int>(problem.vars.size());
  for (int v = 0; v < vars; ++v) {
    const auto& var = problem.vars[v];
    if (var.cost.empty()) invalid(varLabel(problem, v) + " has no choices");
    if (!var.choiceNames.empty() && var.choiceNames.size() != var.cost.size()) {
      invalid(varLabel(problem, v) + " has " + std::to_string(var.choiceNames.size()) +
              " choice names for " + std::to_string(var.cost.size()) + " choices");
    }
    for (size_t k = 0; k < var.cost.size(); ++k) {
      if (!std::isfinite(var.cost[k])) {
        invalid(varLabel(problem, v) + ": cost[" + std::to_string(k) + "] is " +
                std::to_string(var.cost[k]) + ", not finite");
      }
    }
  }
  for (size_t i = 0; i < problem.edges.size(); ++i) {
    const auto& edge = problem.edges[i];
    checkPairMatrix(problem,
                    "edge " + std::to_string(i) + " (var " + std::to_string(edge.u) + " -> var " +
                        std::to_string(edge.v) + ")",
                    "cost", edge.u, edge.v, edge.cost, true);
  }
  for (size_t r = 0; r < problem.memory.size(); ++r) {
    const auto& row = problem.memory[r];
    const std::string label = rowLabel(problem, r);
    if (!std::isfinite(row.constant)) {
      invalid(label + ": constant is " + std::to_string(row.constant) + ", not finite");
    }
    for (size_t t = 0; t < row.terms.size(); ++t) {
      const auto& [v, bytes] = row.terms[t];
      const std::string term = label + ", term " + std::to_string(t);
      if (v < 0 || v >= vars) {
        invalid(term + ": var index " + std::to_string(v) + " is out of range [0, " +
                std::to_string(vars) + ")");
      }
      if (static_cast<int>(bytes.size()) != choiceCount(problem, v)) {
        invalid(term + ": " + std::to_string(bytes.size()) + " bytes given, " +
                varLabel(problem, v) + " has " + std::to_string(choiceCount(problem, v)) +
                " choices");
      }
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (!std::isfinite(bytes[k])) {
          invalid(term + ": bytes[" + std::to_string(k) + "] is " + std::to_string(bytes[k]) +
                  ", not finite");
        }
      }
    }
  }
  for (size_t r = 0; r < problem.memory.size(); ++r) {
    const auto& row = problem.memory[r];
    for (size_t t = 0; t < row.pairs.size(); ++t) {
      const auto& pair = row.pairs[t];
      checkPairMatrix(problem,
                      rowLabel(problem, static_cast<int>(r)) + ", pair " + std::to_string(t),
                      "bytes", pair.u, pair.v, pair.bytes, false);
    }
  }
  if (std::isnan(problem.memoryLimit)) invalid("memoryLimit is NaN");
}

Selection solveBruteForce(const SelectionProblem& problem, int64_t maxCombinations) {
  validate(problem);
  const auto start = Clock::now();
  const int vars = static_cast<int>(problem.vars.size());
  int64_t combinations = 1;
  for (int v = 0; v < vars; ++v) {
    if (combinations > maxCombinations / choiceCount(problem, v)) {
      throw std::invalid_argument("solveBruteForce: more than " + std::to_string(maxCombinations) +
                                  " combinations of choices");
    }
    combinations *= choiceCount(problem, v);
  }

  Selection selection;
  selection.status = "infeasible";
  double best = kInf;
  std::vector<int> choice(vars, 0);
  for (;;) {
    const double peak = peakOf(problem, choice);
    if (problem.memoryLimit <= 0 || peak <= problem.memoryLimit) {
      const double objective = objectiveOf(problem, choice);
      if (objective < best) {
        best = objective;
        selection.status = "optimal";
        selection.choice = choice;
        selection.objective = selection.bound = objective;
        selection.peakMemory = peak;
      }
    }
    // Next choice in lexicographic order: the last var turns fastest.
    int v = vars - 1;
    while (v >= 0 && ++choice[v] == choiceCount(problem, v)) choice[v--] = 0;
    if (v < 0) break;
  }
  selection.seconds = secondsSince(start);
  return selection;
}

}  // namespace sb::strategies::autoshard
