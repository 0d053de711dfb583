// The program of ilp.h, built for CBC: first the presolve the header describes (self edges,
// parallel edges, closed and dominated choices, additive edges), then one column per open
// choice s[v][k] and per allowed pair e[k][l] of every edge left, then CBC's branch and bound
// with all of its output silenced. The goals share the columns and rows; only the objective,
// the memory rows and which edges keep their e differ:
//
//   time         objective c.s + R.e; rows const + m.s <= memoryLimit; every edge
//   peak memory  objective z;         rows const + m.s - z <= 0;       edges that forbid a pair
//   least bytes  objective c.s;       no memory rows;                  edges that forbid a pair
//
// (least bytes, with each choice's largest bytes as c, finds the peak the smallest peak's
// presolve closes choices under).

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

namespace sb::strategies::autoshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// An edge is folded into its vars' costs when R[k][l] - a[k] - b[l] is within this fraction
// of its largest entry: rounding in the subtraction, not a real difference.
constexpr double kFoldTolerance = 1e-12;
// A sum of bytes is over a limit when above it by more than this fraction of the limit.
constexpr double kSumTolerance = 1e-12;

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

// The memory rows with each var's terms merged: [row] -> var -> bytes per choice.
using Terms = std::vector<std::map<int, std::vector<double>>>;

Terms mergedTerms(const SelectionProblem& problem) {
  Terms rows;
  for (const auto& row : problem.memory) {
    auto& merged = rows.emplace_back();
    for (const auto& [v, bytes] : row.terms) {
      auto [it, fresh] = merged.try_emplace(v, bytes.size(), 0.0);
      for (size_t k = 0; k < bytes.size(); ++k) it->second[k] += bytes[k];
    }
  }
  return rows;
}

// The problem as the program sees it (ilp.h's presolve): self edges and additive edges folded
// into the var costs, parallel edges merged, choices that cannot be taken or are dominated
// closed.
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
// other end, until none is left to close (arc consistency). Returns whether it closed any.
bool closeUnreachable(Reduced& reduced) {
  bool closed = false;
  for (bool changed = true; changed; closed |= changed) {
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
  return closed;
}

// Closes every choice that would put some memory row over `limit` whatever the other vars in
// the row choose: the row's constant, this choice's bytes and the least bytes of every other
// var's open choices add up to more. Returns whether it closed any.
bool closeOverLimit(Reduced& reduced, const SelectionProblem& problem, const Terms& terms,
                    double limit) {
  bool closed = false;
  for (size_t r = 0; r < terms.size(); ++r) {
    double least = problem.memory[r].constant;
    std::map<int, double> leastOf;
    for (const auto& [v, bytes] : terms[r]) {
      double m = kInf;
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (reduced.open[v][k]) m = std::min(m, bytes[k]);
      }
      leastOf[v] = m;
      least += m;
    }
    if (!std::isfinite(least)) continue;  // a var with nothing open: infeasible anyway
    for (const auto& [v, bytes] : terms[r]) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        const double row = least - leastOf[v] + bytes[k];
        // Sums in another order may differ by rounding: a row at the limit is not over it.
        if (reduced.open[v][k] && row - limit > kSumTolerance * std::max(1.0, std::abs(limit))) {
          reduced.open[v][k] = 0;
          closed = true;
        }
      }
    }
  }
  return closed;
}

// Whether choice a of var v is at least as good as choice b in everything the program sees: its
// cost, each edge's entries against every open choice of the other end, each memory row's bytes.
// Replacing b by a in any choice then costs no more, fits wherever b did and forbids no pair.
bool atLeastAsGood(const Reduced& reduced, const Terms& terms, int v, int a, int b) {
  if (reduced.cost[v][a] > reduced.cost[v][b]) return false;
  for (const auto& edge : reduced.edges) {
    if (edge.u == v) {
      for (size_t l = 0; l < edge.cost[a].size(); ++l) {
        if (reduced.open[edge.v][l] && edge.cost[a][l] > edge.cost[b][l]) return false;
      }
    } else if (edge.v == v) {
      for (size_t k = 0; k < edge.cost.size(); ++k) {
        if (reduced.open[edge.u][k] && edge.cost[k][a] > edge.cost[k][b]) return false;
      }
    }
  }
  for (const auto& row : terms) {
    const auto it = row.find(v);
    if (it != row.end() && it->second[a] > it->second[b]) return false;
  }
  return true;
}

// Closes every choice that another open choice is at least as good as. A closed choice
// dominates nothing, so of equal choices the last one compared stays, and no var loses its last.
void closeDominated(Reduced& reduced, const Terms& terms) {
  for (size_t v = 0; v < reduced.open.size(); ++v) {
    auto& open = reduced.open[v];
    for (size_t b = 0; b < open.size(); ++b) {
      for (size_t a = 0; a < open.size() && open[b]; ++a) {
        if (a != b && open[a] && atLeastAsGood(reduced, terms, v, a, b)) open[b] = 0;
      }
    }
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

// The reduced problem; `limit` (bytes, +infinity for none) closes the choices no row can fit.
Reduced reduce(const SelectionProblem& problem, const Terms& terms, double limit) {
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
  for (bool changed = true; changed;) {
    changed = closeUnreachable(reduced);
    if (limit < kInf) changed |= closeOverLimit(reduced, problem, terms, limit);
  }
  for (const auto& open : reduced.open) {
    if (std::find(open.begin(), open.end(), 1) == open.end()) reduced.infeasible = true;
  }
  if (reduced.infeasible) return reduced;
  closeDominated(reduced, terms);
  std::vector<Reduced::Pair> kept;
  for (auto& edge : reduced.edges) {
    if (!foldIfAdditive(edge, reduced)) kept.push_back(std::move(edge));
  }
  reduced.edges = std::move(kept);
  return reduced;
}

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
Program buildProgram(const SelectionProblem& problem, const Terms& terms, const Reduced& reduced,
                     Goal goal, bool& infeasible) {
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
  for (const auto& edge : reduced.edges) {
    const auto& sU = program.column[edge.u];
    const auto& sV = program.column[edge.v];
    if (goal != Goal::kTime) {
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
  // Memory rows are divided by their largest byte count: bytes are 1e9 and more where every
  // other coefficient is near 1, and Clp's simplex stalls on that range. Only open choices
  // count: a choice closed for needing 1e18 bytes must not shrink the others to nothing.
  auto largestBytes = [&](const std::map<int, std::vector<double>>& rowTerms) {
    double largest = 0;
    for (const auto& [v, bytes] : rowTerms) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (reduced.open[v][k]) largest = std::max(largest, std::abs(bytes[k]));
      }
    }
    return largest;
  };
  auto addTerms = [&](int row, const std::map<int, std::vector<double>>& rowTerms, double unit) {
    for (const auto& [v, bytes] : rowTerms) {
      for (size_t k = 0; k < bytes.size(); ++k) {
        const int s = program.column[v][k];
        if (s >= 0 && bytes[k] != 0) program.add(row, s, bytes[k] / unit);
      }
    }
  };
  if (goal == Goal::kTime && problem.memoryLimit > 0) {
    // const_r + m_r.s <= memoryLimit, each row in its own unit.
    for (size_t r = 0; r < terms.size(); ++r) {
      const double room = problem.memoryLimit - problem.memory[r].constant;
      const double unit = largestBytes(terms[r]);
      if (unit == 0) {
        infeasible |= room < 0;
        continue;
      }
      addTerms(program.addRow(-kInf, room / unit), terms[r], unit);
    }
  }
  if (goal == Goal::kPeakMemory && !terms.empty()) {
    // const_r + m_r.s <= z: one unit for every row, that of z.
    for (size_t r = 0; r < terms.size(); ++r) {
      program.memoryUnit = std::max(program.memoryUnit, largestBytes(terms[r]));
    }
    const int z = program.addColumn(-kInf, kInf, 1);
    for (size_t r = 0; r < terms.size(); ++r) {
      const int row = program.addRow(-kInf, -problem.memory[r].constant / program.memoryUnit);
      program.add(row, z, -1);
      addTerms(row, terms[r], program.memoryUnit);
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
double peakBound(const SelectionProblem& problem, const Terms& terms,
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

  Reduced reduced = reduce(problem, terms, kInf);
  if (reduced.infeasible) return kInf;
  double unit = 1;
  for (const auto& bytes : largest) {
    for (const double b : bytes) unit = std::max(unit, std::abs(b));
  }
  for (size_t v = 0; v < largest.size(); ++v) {
    for (size_t k = 0; k < largest[v].size(); ++k) reduced.cost[v][k] = largest[v][k] / unit;
  }
  bool infeasible = false;
  const Program program = buildProgram(problem, terms, reduced, Goal::kLeastBytes, infeasible);
  const Solved solved = runCbc(program, options);
  return solved.found ? peakOf(problem, solved.choice) : kInf;
}

Selection solve(const SelectionProblem& problem, const SelectionOptions& options, Goal goal) {
  validate(problem);
  checkOptions(options);
  const auto start = Clock::now();
  Selection selection;
  const Terms terms = mergedTerms(problem);
  double limit = kInf;
  if (goal == Goal::kTime && problem.memoryLimit > 0) limit = problem.memoryLimit;
  if (goal == Goal::kPeakMemory) limit = peakBound(problem, terms, options);
  const Reduced reduced = reduce(problem, terms, limit);
  bool infeasible = reduced.infeasible;
  Program program;
  if (!infeasible) program = buildProgram(problem, terms, reduced, goal, infeasible);
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
