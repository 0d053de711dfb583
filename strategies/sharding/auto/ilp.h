#pragma once

// Auto-sharding's strategy selection: one sharding choice per node of a model graph, the
// fastest combination that fits in memory. This is the integer program of Alpa (Zheng et al.,
// "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep Learning",
// OSDI 2022, section 4), solved with COIN-OR CBC; building the problem from a graph is done
// elsewhere, and this file knows nothing of graphs or tensors.
//
// A problem has decisions v (a node, or a class of nodes that must choose alike), each with
// choices k = 0 .. n_v - 1 and a cost c[v][k] (the node's compute and communication under that
// choice); edges (u, v) with a matrix R[k][l], the cost of resharding u's output as laid out by
// choice k into the layout choice l of v wants; and memory rows, each one program point at
// which the bytes live on a rank are a constant plus one term per decision, m[v][k], and pair
// terms p[k][l] of two decisions (a copy that exists only where their choices differ).
//
// Alpa's program:
//
//   s[v][k] in {0, 1},   sum_k s[v][k] = 1                 one choice per decision
//   e[k][l] in [0, 1]    for every edge (u, v), u != v:
//                        sum_l e[k][l] = s[u][k],  sum_k e[k][l] = s[v][l]
//   minimise  sum c[v][k] s[v][k] + sum R[k][l] e[k][l]
//   subject to, for every memory row r:  const_r + sum m_r[v][k] s[v][k]
//                                          + sum p_r[k][l] e_uv[k][l] <= memoryLimit
//
// (a pair term needs the pair's e: its edge is kept, with zero costs where the problem has no
// edge between the two)
//
// e needs no integrality of its own: once s is one-hot, choices k* of u and l* of v, the
// marginals force e[k][l] = 0 in every row k != k* and every column l != l* (e is not
// negative and those rows and columns sum to 0), and then row k* sums to 1 through e[k*][l*]
// alone. So e[k*][l*] = 1 and the edge costs exactly R[k*][l*] at every integer point; only the
// LP relaxation sees fractional e, which is what branching is for. A forbidden pair
// (R[k][l] = +infinity: no resharding exists) has no e column at all, so with s[u][k] =
// s[v][l] = 1 row k* could not reach 1: the pair is infeasible, as wanted.
//
// Before CBC sees it the problem is made smaller, none of which changes its optimum:
//   - an edge of a decision to itself (a class feeding itself, like repeated layers) only ever
//     pays R[k][k]: it is added to c[v][k];
//   - parallel edges between the same two decisions are summed into one (transposed where
//     they run the other way);
//   - a choice that cannot be taken is closed (gets no column): a forbidden diagonal of a self
//     edge; a row (column) of an edge that is forbidden against every choice still open for the
//     other end; a choice that puts some memory row over the limit even with the fewest bytes
//     every other decision in the row has open. This repeats until nothing more closes, and a
//     decision with nothing left makes the problem infeasible without a solve;
//   - a choice is closed when another open choice of its decision is at least as good in
//     everything: its cost, its entry against every open choice across every edge, its bytes
//     in every memory row. Swapping it for the other in any answer costs no more, fits wherever
//     it fitted and forbids no pair (of identical choices one stays);
//   - an edge whose matrix over the choices left is R[k][l] = a[k] + b[l] (a constant is the
//     common case: the same resharding whatever is chosen) costs a[k] on u and b[l] on v, so
//     it is folded into c and needs no e at all, unless a memory row has a pair term on it;
//   - pair terms of a decision with itself are its diagonal, added to its own terms; a row's
//     least bytes (closing choices over the limit) take each pair's least over open pairs, a
//     choice's its least against the other end's open choices; dominance compares pair bytes
//     entry by entry, as edge costs.
// Decisions with a single choice left stay in the program, fixed by their own row.
//
// The smallest peak (solveMinPeakMemory) is the same program with another objective: minimise
// z subject to const_r + m_r.s <= z for every row; edge costs do not count, and an edge only
// keeps its e columns where it forbids a pair. Its memory limit, for closing choices, is the
// peak of one choice without a forbidden pair: each decision's choice with the fewest bytes in
// its largest row, or where those forbid a pair, CBC's cheapest choice with those bytes as
// costs (a second, quick solve). A caller that bars choices with 1e18 bytes thus gets them
// closed instead of setting the scale every row is written in.
//
// CBC: a memory row is divided by its largest byte count among open choices (the smallest
// peak's rows by the largest of all, z's unit), since Clp's simplex stalls on bytes of 1e9
// beside costs near 1; a limit then holds to CBC's feasibility tolerance, about 1e-7 of that
// unit. Branching is on pseudo-costs with no strong branching, and rounding, the feasibility
// pump and diving look for choices. Without a memory limit the relaxation is tight on a tree of
// edges and nearly so otherwise, and a 40 x 20 problem solves in a tenth of a second; a tight
// limit makes it a knapsack, and the time limit then decides. CBC checks that limit between
// nodes and heuristics, so a solve can run past it somewhat.
//
// Units are the caller's: costs in microseconds, memory in bytes per rank. The objective and
// peak memory this file reports are always recomputed from the rounded choices with evaluate()
// and peakMemory(), never read back from the solver. Results are deterministic short of the
// time limit: CBC runs on one thread with fixed seeds.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sb::strategies::autoshard {

struct SelectionProblem {
  // One decision: a node, or a class of nodes sharing one choice.
  struct Var {
    std::string name;
    std::vector<double> cost;              // per choice, microseconds; finite
    std::vector<std::string> choiceNames;  // optional: same size as cost, or empty
  };
  // Resharding between two decisions. u == v is allowed (a class feeding itself): only
  // cost[k][k] applies.
  struct Edge {
    int u = 0, v = 0;                       // indices into vars
    std::vector<std::vector<double>> cost;  // [choice of u][choice of v], microseconds;
                                            // +infinity: that pair is forbidden
  };
  // Bytes that two decisions' choices decide together: bytes[k][l] when u takes k and v takes
  // l (a copy that exists only where their layouts differ). u == v: only bytes[k][k] applies.
  struct PairTerm {
    int u = 0, v = 0;
    std::vector<std::vector<double>> bytes;  // [choice of u][choice of v]
  };
  // One program point: bytes live on a rank = constant + sum over terms of bytes[choice_v] +
  // sum over pairs of bytes[choice_u][choice_v].
  struct MemoryRow {
    std::string what;
    double constant = 0;
    // (var index, bytes per choice); a var given twice in one row counts twice.
    std::vector<std::pair<int, std::vector<double>>> terms;
    std::vector<PairTerm> pairs;
  };
  std::vector<Var> vars;
  std::vector<Edge> edges;  // several edges between the same pair are summed
  std::vector<MemoryRow> memory;
  double memoryLimit = 0;  // bytes per rank; <= 0: no limit
};

struct SelectionOptions {
  double timeLimitSeconds = 60;  // wall time
  double relativeGap = 0.0;      // stop once (objective - bound) / |objective| is within this
};

// A solve's answer. When no choice was found (infeasible, no_solution) choice is empty;
// objective, gap and peakMemory are 0, and bound is CBC's bound where it has one (no_solution).
struct Selection {
  // "optimal"; "feasible" (stopped by the time limit or the gap, with a choice); "infeasible";
  // "no_solution" (stopped by the time limit before any choice was found).
  std::string status;
  std::vector<int> choice;  // per var
  double objective = 0;     // evaluate(problem, choice)
  double bound = 0;         // the solver's lower bound (== objective for brute force)
  double gap = 0;           // (objective - bound) / max(1e-9, |objective|), never negative
  double peakMemory = 0;    // peakMemory(problem, choice)
  double seconds = 0;       // wall time of the solve
  int variables = 0;        // columns of the program given to CBC (0 for brute force)
  int constraints = 0;      // rows of that program
};

// The objective of `choice`: var costs plus edge costs; +infinity when an edge's pair is
// forbidden. Throws std::invalid_argument as validate() does, and when choice does not have one
// valid index per var.
double evaluate(const SelectionProblem& problem, const std::vector<int>& choice);

// The largest memory row's value under `choice`; 0 when there are no rows. Throws as evaluate.
double peakMemory(const SelectionProblem& problem, const std::vector<int>& choice);

// Throws std::invalid_argument naming the var, edge or row (by index, and name where it has
// one) and what is wrong: a var with no choices, a size that does not match the var's number
// of choices, an index out of range, a cost that is NaN (or, for a var, not finite; for an
// edge, -infinity), bytes or a constant that are not finite, a NaN memory limit.
void validate(const SelectionProblem& problem);

// The fastest choice within problem.memoryLimit, by CBC. Validates the problem (throws as
// validate()) and the options (throws std::invalid_argument unless timeLimitSeconds > 0 and
// relativeGap >= 0) first.
Selection solveIlp(const SelectionProblem& problem, const SelectionOptions& options = {});

// The same answer by trying every combination (status "optimal" or "infeasible"); among equal
// objectives, the first in lexicographic order of choice. Throws std::invalid_argument as
// validate() does, and when the number of combinations exceeds maxCombinations.
Selection solveBruteForce(const SelectionProblem& problem, int64_t maxCombinations = 10'000'000);

// The smallest memory limit under which some choice exists: the minimum over choices without
// a forbidden pair of peakMemory, time cost ignored (problem.memoryLimit too). Returns the
// choice achieving it; objective is evaluate() of that choice, while bound and gap are about
// peak memory: bound is the solver's lower bound on the peak, gap = (peakMemory - bound) /
// max(1e-9, |peakMemory|). Validates and throws as solveIlp.
Selection solveMinPeakMemory(const SelectionProblem& problem, const SelectionOptions& options = {});

}  // namespace sb::strategies::autoshard
