// The presolve of ilp.h (self edges, parallel edges, closed and dominated choices, additive
// edges): the reduced problem that ilp.cpp writes as CBC's program. Its own file: it needs no
// CBC and is the half of the solver that reasons about the problem, not the program.

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "strategies/sharding/auto/ilp.h"
#include "strategies/sharding/auto/ilp_internal.h"

namespace sb::strategies::autoshard {
namespace {

// An edge is folded into its vars' costs when R[k][l] - a[k] - b[l] is within this fraction
// of its largest entry: rounding in the subtraction, not a real difference.
constexpr double kFoldTolerance = 1e-12;
// A sum of bytes is over a limit when above it by more than this fraction of the limit.
constexpr double kSumTolerance = 1e-12;

}  // namespace

// ---- Presolve ----------------------------------------------------------------------------

Terms mergedTerms(const SelectionProblem& problem) {
  Terms rows;
  for (const auto& row : problem.memory) {
    auto& merged = rows.emplace_back();
    for (const auto& [v, bytes] : row.terms) {
      auto [it, fresh] = merged.try_emplace(v, bytes.size(), 0.0);
      for (size_t k = 0; k < bytes.size(); ++k) it->second[k] += bytes[k];
    }
    for (const auto& pair : row.pairs) {
      if (pair.u != pair.v) continue;
      auto [it, fresh] = merged.try_emplace(pair.u, pair.bytes.size(), 0.0);
      for (size_t k = 0; k < pair.bytes.size(); ++k) it->second[k] += pair.bytes[k][k];
    }
  }
  return rows;
}

PairTerms mergedPairs(const SelectionProblem& problem) {
  PairTerms rows;
  for (const auto& row : problem.memory) {
    auto& merged = rows.emplace_back();
    for (const auto& pair : row.pairs) {
      if (pair.u == pair.v) continue;
      const int u = std::min(pair.u, pair.v), v = std::max(pair.u, pair.v);
      const bool transposed = pair.u > pair.v;
      auto [it, fresh] = merged.try_emplace(
          {u, v},
          Matrix(choiceCount(problem, u), std::vector<double>(choiceCount(problem, v), 0.0)));
      for (size_t k = 0; k < it->second.size(); ++k) {
        for (size_t l = 0; l < it->second[k].size(); ++l) {
          it->second[k][l] += transposed ? pair.bytes[l][k] : pair.bytes[k][l];
        }
      }
    }
  }
  return rows;
}

namespace {

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
                    const PairTerms& pairs, double limit) {
  bool closed = false;
  for (size_t r = 0; r < terms.size(); ++r) {
    double least = problem.memory[r].constant;
    // Per var and choice: its own bytes and, for every pair it is in, its least bytes against
    // the other end's open choices less the pair's least over all open pairs (what choosing it
    // adds to the row's least).
    std::map<int, std::vector<double>> extra;
    const auto extraOf = [&](int v) -> std::vector<double>& {
      auto [it, fresh] = extra.try_emplace(v, reduced.open[v].size(), 0.0);
      return it->second;
    };
    for (const auto& [v, bytes] : terms[r]) {
      double m = kInf;
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (reduced.open[v][k]) m = std::min(m, bytes[k]);
      }
      least += m;
      auto& e = extraOf(v);
      for (size_t k = 0; k < bytes.size(); ++k) e[k] += bytes[k] - m;
    }
    for (const auto& [ends, bytes] : pairs[r]) {
      const auto [u, v] = ends;
      std::vector<double> byU(bytes.size(), kInf), byV(bytes[0].size(), kInf);
      double m = kInf;
      for (size_t k = 0; k < bytes.size(); ++k) {
        for (size_t l = 0; l < bytes[k].size(); ++l) {
          if (!reduced.open[u][k] || !reduced.open[v][l]) continue;
          byU[k] = std::min(byU[k], bytes[k][l]);
          byV[l] = std::min(byV[l], bytes[k][l]);
          m = std::min(m, bytes[k][l]);
        }
      }
      least += m;
      auto& eu = extraOf(u);
      for (size_t k = 0; k < byU.size(); ++k) eu[k] += byU[k] - m;
      auto& ev = extraOf(v);
      for (size_t l = 0; l < byV.size(); ++l) ev[l] += byV[l] - m;
    }
    if (!std::isfinite(least)) continue;  // a var with nothing open: infeasible anyway
    for (const auto& [v, e] : extra) {
      for (size_t k = 0; k < e.size(); ++k) {
        const double row = least + e[k];
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
bool atLeastAsGood(const Reduced& reduced, const Terms& terms, const PairTerms& pairs, int v, int a,
                   int b) {
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
  for (const auto& row : pairs) {
    for (const auto& [ends, bytes] : row) {
      if (ends.first == v) {
        for (size_t l = 0; l < bytes[a].size(); ++l) {
          if (reduced.open[ends.second][l] && bytes[a][l] > bytes[b][l]) return false;
        }
      } else if (ends.second == v) {
        for (size_t k = 0; k < bytes.size(); ++k) {
          if (reduced.open[ends.first][k] && bytes[k][a] > bytes[k][b]) return false;
        }
      }
    }
  }
  return true;
}

// Closes every choice that another open choice is at least as good as. A closed choice
// dominates nothing, so of equal choices the last one compared stays, and no var loses its last.
void closeDominated(Reduced& reduced, const Terms& terms, const PairTerms& pairs) {
  for (size_t v = 0; v < reduced.open.size(); ++v) {
    auto& open = reduced.open[v];
    for (size_t b = 0; b < open.size(); ++b) {
      for (size_t a = 0; a < open.size() && open[b]; ++a) {
        if (a != b && open[a] && atLeastAsGood(reduced, terms, pairs, v, a, b)) open[b] = 0;
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

}  // namespace

Reduced reduce(const SelectionProblem& problem, const Terms& terms, const PairTerms& pairs,
               double limit) {
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
  // A pair term needs its pair's e: an edge, of zero costs where the problem has none.
  std::set<std::pair<int, int>> withMemory;
  for (const auto& row : pairs) {
    for (const auto& [ends, bytes] : row) {
      withMemory.insert(ends);
      merged.try_emplace(ends, Matrix(choiceCount(problem, ends.first),
                                      std::vector<double>(choiceCount(problem, ends.second), 0.0)));
    }
  }
  for (auto& [ends, cost] : merged) {
    reduced.edges.push_back({ends.first, ends.second, cost, withMemory.count(ends) > 0});
  }
  for (bool changed = true; changed;) {
    changed = closeUnreachable(reduced);
    if (limit < kInf) changed |= closeOverLimit(reduced, problem, terms, pairs, limit);
  }
  for (const auto& open : reduced.open) {
    if (std::find(open.begin(), open.end(), 1) == open.end()) reduced.infeasible = true;
  }
  if (reduced.infeasible) return reduced;
  closeDominated(reduced, terms, pairs);
  std::vector<Reduced::Pair> kept;
  for (auto& edge : reduced.edges) {
    // An edge with memory keeps its e: folding its costs would leave its pair terms no column.
    if (edge.memory || !foldIfAdditive(edge, reduced)) kept.push_back(std::move(edge));
  }
  reduced.edges = std::move(kept);
  return reduced;
}

}  // namespace sb::strategies::autoshard
