// The program of ilp.h, built for CBC: first the presolve the header describes (self edges,
// parallel edges, closed and dominated choices, additive edges: ilp_presolve.cpp), then one
// column per open choice s[v][k] and per allowed pair e[k][l] of every edge left, then CBC's
// branch and bound with all of its output silenced. The goals share the columns and rows; only
// the objective, the memory rows and which edges keep their e differ:
//
//   time         objective c.s + R.e; rows const + m.s + p.e <= memoryLimit; every edge
//   peak memory  objective z;         rows const + m.s + p.e - z <= 0;  edges that forbid a
//                                                                       pair or have pair terms
//   least bytes  objective c.s;       no memory rows;                  edges that forbid a pair
//
// (least bytes, with each choice's largest bytes as c, finds the peak the smallest peak's
// presolve closes choices under). The problem's checks, a choice's value and the brute force
// are ilp_problem.cpp; CBC is used only here.

#include "strategies/sharding/auto/ilp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <CbcHeuristic.hpp>
#include <CbcHeuristicDiveCoefficient.hpp>
#include <CbcHeuristicFPump.hpp>
#include <CbcModel.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

#include "strategies/sharding/auto/ilp_internal.h"

namespace sb::strategies::autoshard {
namespace {

// ---- The program -------------------------------------------------------------------------

// kLeastBytes: the reduced costs alone (peakBound sets them to bytes), edges only where they
// forbid a pair, no memory rows.
enum class Goal { kTime, kPeakMemory, kLeastBytes };

// A linear program in the triplet form CoinPackedMatrix is built from.
struct Program {
  std::vector<double> colLower, colUpper, objective;
  std::vector<double> rowLower, rowUpper;
  std::vector<int> rowIndex, colIndex;
  std::vector<double> element;
  std::vector<std::vector<int>> column;  // [var][choice]: the column of s, -1 where closed
  double memoryUnit = 1;                 // smallest peak: bytes per unit of z

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
Program buildProgram(const SelectionProblem& problem, const Terms& terms, const PairTerms& pairs,
                     const Reduced& reduced, Goal goal, bool& infeasible) {
  Program program;
  for (size_t v = 0; v < reduced.cost.size(); ++v) {
    auto& columns = program.column.emplace_back(reduced.cost[v].size(), -1);
    const int oneChoice = program.addRow(1, 1);
    for (size_t k = 0; k < columns.size(); ++k) {
      if (!reduced.open[v][k]) continue;
      columns[k] = program.addColumn(0, 1, goal == Goal::kPeakMemory ? 0 : reduced.cost[v][k]);
      program.add(oneChoice, columns[k], 1);
    }
  }
  // The e columns of each kept edge, for the memory rows' pair terms: [choice of u][of v].
  std::map<std::pair<int, int>, std::vector<std::vector<int>>> pairColumns;
  for (const auto& edge : reduced.edges) {
    const auto& sU = program.column[edge.u];
    const auto& sV = program.column[edge.v];
    if (goal != Goal::kTime && !(edge.memory && goal == Goal::kPeakMemory)) {
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
    auto& columns = pairColumns[{edge.u, edge.v}];
    columns.assign(sU.size(), std::vector<int>(sV.size(), -1));
    for (size_t k = 0; k < sU.size(); ++k) {
      for (size_t l = 0; l < sV.size(); ++l) {
        if (sU[k] < 0 || sV[l] < 0 || edge.cost[k][l] == kInf) continue;
        const int e = program.addColumn(0, 1, goal == Goal::kTime ? edge.cost[k][l] : 0);
        program.add(marginalU[k], e, 1);
        program.add(marginalV[l], e, 1);
        columns[k][l] = e;
      }
    }
  }
  // Memory rows are divided by their largest byte count: bytes are 1e9 and more where every
  // other coefficient is near 1, and Clp's simplex stalls on that range. Only open choices
  // count: a choice closed for needing 1e18 bytes must not shrink the others to nothing.
  auto largestBytes = [&](size_t r) {
    double largest = 0;
    for (const auto& [v, bytes] : terms[r]) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (reduced.open[v][k]) largest = std::max(largest, std::abs(bytes[k]));
      }
    }
    for (const auto& [ends, bytes] : pairs[r]) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        for (size_t l = 0; l < bytes[k].size(); ++l) {
          if (reduced.open[ends.first][k] && reduced.open[ends.second][l]) {
            largest = std::max(largest, std::abs(bytes[k][l]));
          }
        }
      }
    }
    return largest;
  };
  auto addTerms = [&](int row, size_t r, double unit) {
    for (const auto& [v, bytes] : terms[r]) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        const int s = program.column[v][k];
        if (s >= 0 && bytes[k] != 0) program.add(row, s, bytes[k] / unit);
      }
    }
    // A pair's bytes on its e columns (a forbidden pair has none: it is never taken).
    for (const auto& [ends, bytes] : pairs[r]) {
      const auto& columns = pairColumns.at(ends);
      for (size_t k = 0; k < bytes.size(); ++k) {
        for (size_t l = 0; l < bytes[k].size(); ++l) {
          const int e = columns[k][l];
          if (e >= 0 && bytes[k][l] != 0) program.add(row, e, bytes[k][l] / unit);
        }
      }
    }
  };
  if (goal == Goal::kTime && problem.memoryLimit > 0) {
    // const_r + m_r.s <= memoryLimit, each row in its own unit.
    for (size_t r = 0; r < terms.size(); ++r) {
      const double room = problem.memoryLimit - problem.memory[r].constant;
      const double unit = largestBytes(r);
      if (unit == 0) {
        infeasible |= room < 0;
        continue;
      }
      addTerms(program.addRow(-kInf, room / unit), r, unit);
    }
  }
  if (goal == Goal::kPeakMemory && !terms.empty()) {
    // const_r + m_r.s <= z: one unit for every row, that of z.
    for (size_t r = 0; r < terms.size(); ++r) {
      program.memoryUnit = std::max(program.memoryUnit, largestBytes(r));
    }
    const int z = program.addColumn(-kInf, kInf, 1);
    for (size_t r = 0; r < terms.size(); ++r) {
      const int row = program.addRow(-kInf, -problem.memory[r].constant / program.memoryUnit);
      program.add(row, z, -1);
      addTerms(row, r, program.memoryUnit);
    }
  }
  return program;
}

struct Solved {
  std::string status;  // as Selection::status
  bool found = false;  // a choice, possibly the empty one
  std::vector<int> choice;
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
  model.setUseElapsedTime(true);  // the limit is wall time, as Selection::seconds is
  model.setMaximumSeconds(options.timeLimitSeconds);
  model.setAllowableFractionGap(options.relativeGap);
  // Branch on pseudo-costs alone: with a thousand binaries over tens of thousands of columns,
  // strong branching's trial solves took seconds per node. Rounding, the feasibility pump and
  // diving find the first choice that fits a tight memory limit (and one at all for the
  // smallest peak, where the relaxation is fractional everywhere) long before branching would.
  model.setNumberStrong(0);
  model.setNumberBeforeTrust(0);
  CbcRounding rounding(model);
  CbcHeuristicFPump pump(model);
  CbcHeuristicDiveCoefficient dive(model);
  model.addHeuristic(&rounding);  // each is copied
  model.addHeuristic(&pump);
  model.addHeuristic(&dive);
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
  solved.found = true;
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

// A bound on the smallest peak, from a choice that forbids no pair: for every var the choice
// whose largest bytes in any row are least, or where that forbids a pair, CBC's choice with
// those bytes as costs. +infinity where there is none. Closing the choices that cannot fit under
// it keeps a bar of 1e18 bytes from setting the unit every row is written in.
double peakBound(const SelectionProblem& problem, const Terms& terms, const PairTerms& pairs,
                 const SelectionOptions& options) {
  Matrix largest;
  std::vector<int> choice;
  for (size_t v = 0; v < problem.vars.size(); ++v) {
    auto& bytes = largest.emplace_back(problem.vars[v].cost.size(), 0.0);
    for (const auto& row : terms) {
      const auto it = row.find(v);
      if (it == row.end()) continue;
      for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = std::max(bytes[k], it->second[k]);
    }
    choice.push_back(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
  }
  if (objectiveOf(problem, choice) < kInf) return peakOf(problem, choice);

  Reduced reduced = reduce(problem, terms, pairs, kInf);
  if (reduced.infeasible) return kInf;
  double unit = 1;
  for (const auto& bytes : largest) {
    for (const double b : bytes) unit = std::max(unit, std::abs(b));
  }
  for (size_t v = 0; v < largest.size(); ++v) {
    for (size_t k = 0; k < largest[v].size(); ++k) reduced.cost[v][k] = largest[v][k] / unit;
  }
  bool infeasible = false;
  const Program program =
      buildProgram(problem, terms, pairs, reduced, Goal::kLeastBytes, infeasible);
  const Solved solved = runCbc(program, options);
  return solved.found ? peakOf(problem, solved.choice) : kInf;
}

Selection solve(const SelectionProblem& problem, const SelectionOptions& options, Goal goal) {
  validate(problem);
  checkOptions(options);
  const auto start = Clock::now();
  Selection selection;
  const Terms terms = mergedTerms(problem);
  const PairTerms pairs = mergedPairs(problem);
  double limit = kInf;
  if (goal == Goal::kTime && problem.memoryLimit > 0) limit = problem.memoryLimit;
  if (goal == Goal::kPeakMemory) limit = peakBound(problem, terms, pairs, options);
  const Reduced reduced = reduce(problem, terms, pairs, limit);
  bool infeasible = reduced.infeasible;
  Program program;
  if (!infeasible) program = buildProgram(problem, terms, pairs, reduced, goal, infeasible);
  selection.variables = program.columns();
  selection.constraints = program.rows();

  Solved solved;
  if (infeasible) {
    solved.status = "infeasible";
  } else if (problem.vars.empty()) {
    // Nothing to choose (and CBC wants integers): the empty choice is the answer.
    solved.status = "optimal";
    solved.found = true;
    solved.bound = goal == Goal::kTime ? 0 : peakOf(problem, {});
  } else {
    solved = runCbc(program, options);
    if (goal == Goal::kPeakMemory) solved.bound *= program.memoryUnit;
  }

  selection.status = solved.status;
  if (solved.found) {
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

Selection solveIlp(const SelectionProblem& problem, const SelectionOptions& options) {
  return solve(problem, options, Goal::kTime);
}

Selection solveMinPeakMemory(const SelectionProblem& problem, const SelectionOptions& options) {
  return solve(problem, options, Goal::kPeakMemory);
}

}  // namespace sb::strategies::autoshard
