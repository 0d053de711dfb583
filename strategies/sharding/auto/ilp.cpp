// The program of ilp.h, built for CBC: first the presolve the header describes (self edges,
// parallel edges, closed choices, additive edges), then one column per open choice s[v][k] and
// per allowed pair e[k][l] of every edge left, then CBC's branch and bound with all of its
// output silenced. Both goals share the same columns and rows; only the objective and the
// memory rows differ:
//
//   time         objective c.s + R.e; memory rows  const + m.s <= memoryLimit
//   peak memory  objective z;         memory rows  const + m.s - z <= 0, edges only where
//                                     they forbid a pair (their cost does not count)

#include "strategies/sharding/auto/ilp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <CbcModel.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

namespace sb::strategies::autoshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// An edge is folded into its vars' costs when R[k][l] - a[k] - b[l] is within this fraction
// of its largest entry: rounding in the subtraction, not a real difference.
constexpr double kFoldTolerance = 1e-12;

using Matrix = std::vector<std::vector<double>>;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int choiceCount(const SelectionProblem& problem, int v) {
  return static_cast<int>(problem.vars[v].cost.size());
}

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

// evaluate() and peakMemory() of a problem and choice already checked.
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
    peak = std::max(peak, bytes);
  }
  return peak;
}

// ---- Presolve ----------------------------------------------------------------------------

// The problem as the program sees it (ilp.h's presolve): self edges and additive edges folded
// into the var costs, parallel edges merged, choices that cannot be taken closed.
struct Reduced {
  Matrix cost;                          // [var][choice]
  std::vector<std::vector<char>> open;  // [var][choice]
  struct Pair {
    int u = 0, v = 0;  // u < v
    Matrix cost;       // [choice of u][choice of v]
  };
  std::vector<Pair> edges;  // one per pair of vars, none of them additive
  bool infeasible = false;  // some var has no open choice
};

// Closes every choice of one end of an edge that is forbidden against every open choice of the
// other end, until none is left to close (arc consistency).
void closeUnreachable(Reduced& reduced) {
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& edge : reduced.edges) {
      auto& openU = reduced.open[edge.u];
      auto& openV = reduced.open[edge.v];
      for (size_t k = 0; k < openU.size(); ++k) {
        if (!openU[k]) continue;
        bool reachable = false;
        for (size_t l = 0; l < openV.size() && !reachable; ++l) {
          reachable = openV[l] && edge.cost[k][l] < kInf;
        }
        if (!reachable) openU[k] = 0, changed = true;
      }
      for (size_t l = 0; l < openV.size(); ++l) {
        if (!openV[l]) continue;
        bool reachable = false;
        for (size_t k = 0; k < openU.size() && !reachable; ++k) {
          reachable = openU[k] && edge.cost[k][l] < kInf;
        }
        if (!reachable) openV[l] = 0, changed = true;
      }
    }
  }
  for (const auto& open : reduced.open) {
    if (std::find(open.begin(), open.end(), 1) == open.end()) reduced.infeasible = true;
  }
}

// Whether the edge over the open choices is R[k][l] = a[k] + b[l]; if so, adds a to u's costs
// and b to v's.
bool foldIfAdditive(const Reduced::Pair& edge, Reduced& reduced) {
  const auto& openU = reduced.open[edge.u];
  const auto& openV = reduced.open[edge.v];
  const int k0 = std::find(openU.begin(), openU.end(), 1) - openU.begin();
  const int l0 = std::find(openV.begin(), openV.end(), 1) - openV.begin();
  const Matrix& r = edge.cost;
  double largest = 0;
  for (size_t k = 0; k < openU.size(); ++k) {
    for (size_t l = 0; l < openV.size(); ++l) {
      if (!openU[k] || !openV[l]) continue;
      if (r[k][l] == kInf) return false;
      largest = std::max(largest, std::abs(r[k][l]));
    }
  }
  // a[k] = R[k][l0], b[l] = R[k0][l] - R[k0][l0].
  for (size_t k = 0; k < openU.size(); ++k) {
    for (size_t l = 0; l < openV.size(); ++l) {
      if (!openU[k] || !openV[l]) continue;
      const double residual = r[k][l] - r[k][l0] - (r[k0][l] - r[k0][l0]);
      if (std::abs(residual) > kFoldTolerance * largest) return false;
    }
  }
  for (size_t k = 0; k < openU.size(); ++k) {
    if (openU[k]) reduced.cost[edge.u][k] += r[k][l0];
  }
  for (size_t l = 0; l < openV.size(); ++l) {
    if (openV[l]) reduced.cost[edge.v][l] += r[k0][l] - r[k0][l0];
  }
  return true;
}

Reduced reduce(const SelectionProblem& problem) {
  Reduced reduced;
  for (const auto& var : problem.vars) {
    reduced.cost.push_back(var.cost);
    reduced.open.emplace_back(var.cost.size(), 1);
  }
  std::map<std::pair<int, int>, Matrix> merged;
  for (const auto& edge : problem.edges) {
    if (edge.u == edge.v) {
      for (size_t k = 0; k < edge.cost.size(); ++k) {
        if (edge.cost[k][k] == kInf) {
          reduced.open[edge.u][k] = 0;
        } else {
          reduced.cost[edge.u][k] += edge.cost[k][k];
        }
      }
      continue;
    }
    const int u = std::min(edge.u, edge.v), v = std::max(edge.u, edge.v);
    const bool transposed = edge.u > edge.v;
    auto [it, fresh] = merged.try_emplace(
        {u, v}, Matrix(choiceCount(problem, u), std::vector<double>(choiceCount(problem, v), 0.0)));
    for (size_t k = 0; k < it->second.size(); ++k) {
      for (size_t l = 0; l < it->second[k].size(); ++l) {
        it->second[k][l] += transposed ? edge.cost[l][k] : edge.cost[k][l];
      }
    }
  }
  for (auto& [ends, cost] : merged) reduced.edges.push_back({ends.first, ends.second, cost});
  closeUnreachable(reduced);
  if (reduced.infeasible) return reduced;
  std::vector<Reduced::Pair> kept;
  for (auto& edge : reduced.edges) {
    if (!foldIfAdditive(edge, reduced)) kept.push_back(std::move(edge));
  }
  reduced.edges = std::move(kept);
  return reduced;
}

// The memory rows with each var's terms merged: [row] -> var -> bytes per choice.
std::vector<std::map<int, std::vector<double>>> mergedTerms(const SelectionProblem& problem) {
  std::vector<std::map<int, std::vector<double>>> rows;
  for (const auto& row : problem.memory) {
    auto& merged = rows.emplace_back();
    for (const auto& [v, bytes] : row.terms) {
      auto [it, fresh] = merged.try_emplace(v, bytes.size(), 0.0);
      for (size_t k = 0; k < bytes.size(); ++k) it->second[k] += bytes[k];
    }
  }
  return rows;
}

// ---- The program -------------------------------------------------------------------------

enum class Goal { kTime, kPeakMemory };

// A linear program in the triplet form CoinPackedMatrix is built from.
struct Program {
  std::vector<double> colLower, colUpper, objective;
  std::vector<double> rowLower, rowUpper;
  std::vector<int> rowIndex, colIndex;
  std::vector<double> element;
  std::vector<std::vector<int>> column;  // [var][choice]: the column of s, -1 where closed

  int addColumn(double lower, double upper, double cost) {
    colLower.push_back(lower);
    colUpper.push_back(upper);
    objective.push_back(cost);
    return static_cast<int>(objective.size()) - 1;
  }
  int addRow(double lower, double upper) {
    rowLower.push_back(lower);
    rowUpper.push_back(upper);
    return static_cast<int>(rowLower.size()) - 1;
  }
  void add(int row, int col, double value) {
    rowIndex.push_back(row);
    colIndex.push_back(col);
    element.push_back(value);
  }
  int columns() const { return static_cast<int>(objective.size()); }
  int rows() const { return static_cast<int>(rowLower.size()); }
};

// The program of `goal` for a reduced problem that is not infeasible. Sets `infeasible` when a
// memory row without terms is over the limit on its own.
Program buildProgram(const SelectionProblem& problem, const Reduced& reduced, Goal goal,
                     bool& infeasible) {
  Program program;
  for (size_t v = 0; v < reduced.cost.size(); ++v) {
    auto& columns = program.column.emplace_back(reduced.cost[v].size(), -1);
    const int oneChoice = program.addRow(1, 1);
    for (size_t k = 0; k < columns.size(); ++k) {
      if (!reduced.open[v][k]) continue;
      columns[k] = program.addColumn(0, 1, goal == Goal::kTime ? reduced.cost[v][k] : 0);
      program.add(oneChoice, columns[k], 1);
    }
  }
  for (const auto& edge : reduced.edges) {
    const auto& sU = program.column[edge.u];
    const auto& sV = program.column[edge.v];
    if (goal == Goal::kPeakMemory) {
      bool forbidsAPair = false;
      for (size_t k = 0; k < sU.size(); ++k) {
        for (size_t l = 0; l < sV.size(); ++l) {
          forbidsAPair |= sU[k] >= 0 && sV[l] >= 0 && edge.cost[k][l] == kInf;
        }
      }
      if (!forbidsAPair) continue;
    }
    // sum_l e[k][l] - s[u][k] = 0 and sum_k e[k][l] - s[v][l] = 0.
    std::vector<int> marginalU(sU.size(), -1), marginalV(sV.size(), -1);
    for (size_t k = 0; k < sU.size(); ++k) {
      if (sU[k] < 0) continue;
      marginalU[k] = program.addRow(0, 0);
      program.add(marginalU[k], sU[k], -1);
    }
    for (size_t l = 0; l < sV.size(); ++l) {
      if (sV[l] < 0) continue;
      marginalV[l] = program.addRow(0, 0);
      program.add(marginalV[l], sV[l], -1);
    }
    for (size_t k = 0; k < sU.size(); ++k) {
      for (size_t l = 0; l < sV.size(); ++l) {
        if (sU[k] < 0 || sV[l] < 0 || edge.cost[k][l] == kInf) continue;
        const int e = program.addColumn(0, 1, goal == Goal::kTime ? edge.cost[k][l] : 0);
        program.add(marginalU[k], e, 1);
        program.add(marginalV[l], e, 1);
      }
    }
  }
  const auto terms = mergedTerms(problem);
  if (goal == Goal::kTime && problem.memoryLimit > 0) {
    for (size_t r = 0; r < terms.size(); ++r) {
      const double room = problem.memoryLimit - problem.memory[r].constant;
      if (terms[r].empty()) {
        infeasible |= room < 0;
        continue;
      }
      const int row = program.addRow(-kInf, room);
      for (const auto& [v, bytes] : terms[r]) {
        for (size_t k = 0; k < bytes.size(); ++k) {
          if (program.column[v][k] >= 0 && bytes[k] != 0)
            program.add(row, program.column[v][k], bytes[k]);
        }
      }
    }
  }
  if (goal == Goal::kPeakMemory && !terms.empty()) {
    const int z = program.addColumn(-kInf, kInf, 1);
    for (size_t r = 0; r < terms.size(); ++r) {
      const int row = program.addRow(-kInf, -problem.memory[r].constant);
      program.add(row, z, -1);
      for (const auto& [v, bytes] : terms[r]) {
        for (size_t k = 0; k < bytes.size(); ++k) {
          if (program.column[v][k] >= 0 && bytes[k] != 0)
            program.add(row, program.column[v][k], bytes[k]);
        }
      }
    }
  }
  return program;
}

struct Solved {
  std::string status;       // as Selection::status
  std::vector<int> choice;  // empty without a solution
  double bound = 0;
};

Solved runCbc(const Program& program, const SelectionOptions& options) {
  CoinPackedMatrix matrix(true, program.rowIndex.data(), program.colIndex.data(),
                          program.element.data(),
                          static_cast<CoinBigIndex>(program.element.size()));
  matrix.setDimensions(program.rows(), program.columns());
  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.getModelPtr()->messageHandler()->setLogLevel(0);
  solver.loadProblem(matrix, program.colLower.data(), program.colUpper.data(),
                     program.objective.data(), program.rowLower.data(), program.rowUpper.data());
  for (const auto& columns : program.column) {
    for (const int c : columns) {
      if (c >= 0) solver.setInteger(c);
    }
  }

  CbcModel model(solver);  // works on its own copy of the solver
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.solver()->messageHandler()->setLogLevel(0);
  if (auto* clp = dynamic_cast<OsiClpSolverInterface*>(model.solver())) {
    clp->getModelPtr()->messageHandler()->setLogLevel(0);
  }
  model.setMaximumSeconds(options.timeLimitSeconds);
  model.setAllowableFractionGap(options.relativeGap);
  model.initialSolve();
  model.branchAndBound();

  Solved solved;
  solved.bound = model.getBestPossibleObjValue();
  if (model.isProvenInfeasible()) {
    solved.status = "infeasible";
    return solved;
  }
  const double* best = model.bestSolution();
  if (!best) {
    solved.status = "no_solution";
    return solved;
  }
  solved.status = model.isProvenOptimal() ? "optimal" : "feasible";
  for (size_t v = 0; v < program.column.size(); ++v) {
    int chosen = -1;
    for (size_t k = 0; k < program.column[v].size(); ++k) {
      const int c = program.column[v][k];
      if (c < 0 || best[c] <= 0.5) continue;
      if (chosen >= 0)
        throw std::logic_error("CBC's solution takes two choices of var " + std::to_string(v));
      chosen = static_cast<int>(k);
    }
    if (chosen < 0)
      throw std::logic_error("CBC's solution takes no choice of var " + std::to_string(v));
    solved.choice.push_back(chosen);
  }
  return solved;
}

void checkOptions(const SelectionOptions& options) {
  if (!(options.timeLimitSeconds > 0)) {
    throw std::invalid_argument("SelectionOptions: timeLimitSeconds must be positive, is " +
                                std::to_string(options.timeLimitSeconds));
  }
  if (!(options.relativeGap >= 0)) {
    throw std::invalid_argument("SelectionOptions: relativeGap must be at least 0, is " +
                                std::to_string(options.relativeGap));
  }
}

Selection solve(const SelectionProblem& problem, const SelectionOptions& options, Goal goal) {
  validate(problem);
  checkOptions(options);
  const auto start = Clock::now();
  Selection selection;
  const Reduced reduced = reduce(problem);
  bool infeasible = reduced.infeasible;
  Program program;
  if (!infeasible) program = buildProgram(problem, reduced, goal, infeasible);
  selection.variables = program.columns();
  selection.constraints = program.rows();

  Solved solved;
  if (infeasible) {
    solved.status = "infeasible";
  } else if (problem.vars.empty()) {
    // Nothing to choose (and CBC wants integers): the empty choice is the answer.
    solved.status = "optimal";
    solved.bound = goal == Goal::kTime ? 0 : peakOf(problem, {});
  } else {
    solved = runCbc(program, options);
  }

  selection.status = solved.status;
  if (!solved.choice.empty() || (problem.vars.empty() && solved.status == "optimal")) {
    selection.choice = solved.choice;
    selection.objective = objectiveOf(problem, selection.choice);
    selection.peakMemory = peakOf(problem, selection.choice);
    // The value the bound is about; CBC's bound may be above it by rounding: a gap below 0.
    const double value = goal == Goal::kTime ? selection.objective : selection.peakMemory;
    selection.bound = std::min(solved.bound, value);
    selection.gap = (value - selection.bound) / std::max(1e-9, std::abs(value));
    // Stopping at an allowed gap leaves CBC's proof "optimal"; only a closed gap is.
    if (selection.status == "optimal" && selection.gap > 1e-9 && options.relativeGap > 0) {
      selection.status = "feasible";
    }
  } else if (solved.status == "no_solution" && std::isfinite(solved.bound)) {
    selection.bound = solved.bound;
  }
  selection.seconds = secondsSince(start);
  return selection;
}

}  // namespace

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
    const std::string label = "edge " + std::to_string(i) + " (var " + std::to_string(edge.u) +
                              " -> var " + std::to_string(edge.v) + ")";
    for (const int end : {edge.u, edge.v}) {
      if (end < 0 || end >= vars) {
        invalid(label + ": var index " + std::to_string(end) + " is out of range [0, " +
                std::to_string(vars) + ")");
      }
    }
    if (static_cast<int>(edge.cost.size()) != choiceCount(problem, edge.u)) {
      invalid(label + ": cost has " + std::to_string(edge.cost.size()) + " rows, " +
              varLabel(problem, edge.u) + " has " + std::to_string(choiceCount(problem, edge.u)) +
              " choices");
    }
    for (size_t k = 0; k < edge.cost.size(); ++k) {
      if (static_cast<int>(edge.cost[k].size()) != choiceCount(problem, edge.v)) {
        invalid(label + ": cost row " + std::to_string(k) + " has " +
                std::to_string(edge.cost[k].size()) + " entries, " + varLabel(problem, edge.v) +
                " has " + std::to_string(choiceCount(problem, edge.v)) + " choices");
      }
      for (size_t l = 0; l < edge.cost[k].size(); ++l) {
        if (std::isnan(edge.cost[k][l]) || edge.cost[k][l] == -kInf) {
          invalid(label + ": cost[" + std::to_string(k) + "][" + std::to_string(l) + "] is " +
                  std::to_string(edge.cost[k][l]) + " (finite or +infinity expected)");
        }
      }
    }
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
  if (std::isnan(problem.memoryLimit)) invalid("memoryLimit is NaN");
}

Selection solveIlp(const SelectionProblem& problem, const SelectionOptions& options) {
  return solve(problem, options, Goal::kTime);
}

Selection solveMinPeakMemory(const SelectionProblem& problem, const SelectionOptions& options) {
  return solve(problem, options, Goal::kPeakMemory);
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
