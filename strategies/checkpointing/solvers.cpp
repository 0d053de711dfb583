// Checkpointing solvers: which stage outputs to keep and which to recompute under a budget.
//
// Every solver here returns a schedule in rotor's operations (chain.h) and lets the simulator
// price it, so that a solver's prediction and the check of its budget are the same numbers.
//
// rotor, the optimal one, is the dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly
// and Shilova, "Optimal checkpointing for heterogeneous chains: how to train deep neural
// networks with limited memory" (2019). Its sub-problem P(i, l, m) is: the input x[i] of stage
// i is held (outside m), the gradient d[l+1] of stage l's output is held (inside m); run the
// backward of stages l .. i in memory m and end holding only d[i]. Two moves solve it:
//
//   - chain:  Fe_i (keep stage i's tape xbar[i+1]), solve P(i+1, l, m - xbar[i+1]), B_i;
//   - leaf j: CF_i, Fn_{i+1} .. Fn_{j-1} (run to x[j] keeping only x[i] and x[j]),
//             solve P(j, l, m - x[j]), then P(i, j-1, m).
//
// and P(i, i, m) is Fe_i then B_i (P(L, L, m) is the loss). Each move is allowed only where
// every operation in it fits m, counted exactly as the simulator counts, so a schedule rotor
// returns is within its budget by construction and its simulated time is the table's value.
// Memory is counted in slots of budget / slots, every size rounded up; where sizes and the
// budget are integers and the budget is at most `slots`, a slot is one unit and the program
// is exact.
//
// The step's own terms (chain.h) are in the program. From the loss to the end the step holds,
// beyond rotor's model, the loss (output_kept), x[L] (output_kept; until B_{L-1}, only where
// held on its own, not in xbar[L]) and, from B_{L-1} on, d[L] (loss_grad_kept): E in all. A
// sub-chain (i, l < L) runs wholly after the loss, behind a leaf move to x[L] (held on its
// own), so with d[L] counted 0 (until B_{L-1} it is in m anyway) it holds E throughout: rows
// (i, l < L) are rotor's model, and rows (i, L) read them at m - E. Besides those, in a row
// (i, L) only a chain move's B_i runs after the loss: beside E, or where i = L-1 beside the
// loss alone (x[L] is in the tape B_{L-1} frees); and the loss must fit d[L] and the loss.

#include "strategies/checkpointing/solvers.h"
#include "strategies/checkpointing/solvers_testing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <thread>

#include <unistd.h>

namespace sb::strategies::checkpointing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Kind = Op::Kind;

// The planted recurrence error (solvers_testing.h); set only by ScopedRotorFault.
RotorFault gRotorFault = RotorFault::kNone;

std::optional<Schedule> priced(const std::string& solver, const Chain& chain, std::vector<Op> ops,
                               double budget) {
  const Simulation s = simulate(chain, ops);
  if (!s.valid) {
    throw std::logic_error("solver " + solver + " built an invalid schedule: " + s.problem);
  }
  if (budget > 0 && s.peak > budget) return std::nullopt;
  Schedule out;
  out.solver = solver;
  out.ops = std::move(ops);
  out.predictedTime = s.time;
  out.predictedPeak = s.peak;
  out.recomputedForwards = s.recomputedForwards;
  return out;
}

// The fastest of several candidate schedules that fits; ties go to the smaller peak.
std::optional<Schedule> fastestFitting(const std::string& solver, const Chain& chain,
                                       const std::vector<std::vector<Op>>& candidates,
                                       double budget) {
  std::optional<Schedule> best;
  for (const auto& ops : candidates) {
    auto s = priced(solver, chain, ops, budget);
    if (!s) continue;
    if (!best || s->predictedTime < best->predictedTime ||
        (s->predictedTime == best->predictedTime && s->predictedPeak < best->predictedPeak)) {
      best = std::move(s);
    }
  }
  return best;
}

// ---- sqrt and greedy (Chen et al., "Training deep nets with sublinear memory cost", 2016) ---

std::vector<int> sqrtBoundaries(int L) {
  const int k = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(L)))));
  std::vector<int> b;
  for (int t = 0; t < k; ++t) b.push_back(t * L / k);
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

// Chen's greedy: walk the stages adding up the tapes they leave; when the sum would pass the
// threshold, the stage starts a new segment.
std::vector<int> greedyBoundaries(const Chain& c, double threshold) {
  std::vector<int> b = {0};
  double run = 0;
  for (int i = 0; i < c.length(); ++i) {
    if (run + c.xbar[i + 1] > threshold && i > b.back()) {
      b.push_back(i);
      run = 0;
    }
    run += c.xbar[i + 1];
  }
  return b;
}

// ---- revolve (Griewank and Walther, "Algorithm 799: revolve", 2000) -------------------------
//
// For a homogeneous chain of n steps (the loss is the last step) and s snapshots besides the
// input, the fewest forward steps is C(n, s) = min over l of l + C(n - l, s - 1) + C(l, s):
// advance l steps, keep a snapshot there, reverse the tail with one snapshot fewer, then the
// head with the snapshot freed again; C(1, s) = 0 and C(n, 0) = n (n - 1) / 2. The minimum is
// Griewank's binomial count; the table gives its split points.
class Revolve {
 public:
  Revolve(int steps, int snapshots) : n_(steps), s_(snapshots) {
    cost_.assign((n_ + 1) * (s_ + 1), 0);
    split_.assign((n_ + 1) * (s_ + 1), 0);
    for (int n = 2; n <= n_; ++n) {
      at(cost_, n, 0) = static_cast<long>(n) * (n - 1) / 2;
      for (int s = 1; s <= s_; ++s) {
        long best = std::numeric_limits<long>::max();
        int arg = 1;
        for (int l = 1; l < n; ++l) {
          const long c = l + at(cost_, n - l, s - 1) + at(cost_, l, s);
          if (c < best) {
            best = c;
            arg = l;
          }
        }
        at(cost_, n, s) = best;
        at(split_, n, s) = arg;
      }
    }
  }

  // The schedule for the chain of L stages and the loss (n = L + 1) with s <= snapshots.
  std::vector<Op> schedule(int L, int s) {
    ops_.clear();
    reverse(0, L + 1, s, L);
    return ops_;
  }
  long forwardSteps(int n, int s) { return at(cost_, n, s); }

 private:
  template <class T>
  T& at(std::vector<T>& v, int n, int s) {
    return v[n * (s_ + 1) + s];
  }
  void leaf(int k, int L) {
    if (k == L) {
      ops_.push_back({Kind::kLoss, 0});
    } else {
      ops_.push_back({Kind::kForwardEnable, k});
      ops_.push_back({Kind::kBackward, k});
    }
  }
  void advance(int from, int to) {  // x[from] held; end holding x[from] and x[to]
    for (int k = from; k < to; ++k) {
      ops_.push_back({k == from ? Kind::kForwardCheck : Kind::kForwardNoGrad, k});
    }
  }
  void reverse(int a, int b, int s, int L) {
    const int n = b - a;
    if (n == 1) {
      leaf(a, L);
      return;
    }
    if (s == 0) {
      for (int k = b - 1; k >= a; --k) {
        advance(a, k);
        leaf(k, L);
      }
      return;
    }
    const int l = at(split_, n, s);
    advance(a, a + l);
    reverse(a + l, b, s - 1, L);
    reverse(a, a + l, s, L);
  }

  int n_, s_;
  std::vector<long> cost_;
  std::vector<int> split_;
  std::vector<Op> ops_;
};

// ---- rotor: what both tables share ------------------------------------------------------------
//
// The chain's sizes in slots, the program's value T(m, i, l) and choice (-1: chain, j: leaf j)
// as each table stores them, and the schedule read back from the choices.
class RotorSlots {
 public:
  // The slot count of a chain's table: one unit a slot where every size and the budget are
  // integers and the budget is at most `slots`, else `slots`.
  static int slotCount(const Chain& c, double budget, int slots) {
    return exactAt(c, budget, slots) ? static_cast<int>(budget) : slots;
  }
  // Whether a slot is one unit: every size and the budget integers, the budget at most `slots`.
  static bool exactAt(const Chain& c, double budget, int slots) {
    const double lossBytes = c.outputKept ? c.lossBytes : 0;
    bool integral = budget == std::floor(budget) && lossBytes == std::floor(lossBytes);
    for (const auto* v : {&c.x, &c.xbar, &c.ftmp, &c.fetmp, &c.btmp}) {
      for (double s : *v) integral = integral && s == std::floor(s);
    }
    return integral && budget <= slots;
  }

  RotorSlots(const Chain& c, double budget, int slots)
      : c_(c),
        L_(c.length()),
        S_(slotCount(c, budget, slots)),
        exact_(exactAt(c, budget, slots)) {
    const double lossBytes = c.outputKept ? c.lossBytes : 0;
    const double unit = budget / S_;
    const auto disc = [&](const std::vector<double>& v) {
      std::vector<int> out;
      // Rounding up keeps every schedule that fits in slots within the budget in bytes; the
      // small allowance absorbs the division's rounding where a size is an exact multiple. A
      // size over the whole budget can never fit: S + 1 slots say so without overflowing an
      // int (an untaped forward's temporaries may be far larger than anything taped).
      for (double s : v) {
        const double q = std::ceil(s / unit - 1e-9);
        out.push_back(q > S_ ? S_ + 1 : static_cast<int>(q));
      }
      return out;
    };
    X_ = disc(c.x);
    XB_ = disc(c.xbar);
    if (gRotorFault == RotorFault::kTapeWithoutItsOutput) {
      for (int i = 1; i <= L_; ++i) XB_[i] = std::max(0, XB_[i] - X_[i]);
    }
    FT_ = disc(c.ftmp);
    FE_ = c.fetmp.empty() ? FT_ : disc(c.fetmp);
    BT_ = disc(c.btmp);
    // Sums with the step's terms rounded up whole: apart, each part would cost up to a slot.
    const double e = (c.outputKept ? c.x[L_] + lossBytes : 0) + (c.lossGradKept ? c.x[L_] : 0);
    LB_ = disc({lossBytes})[0];
    E_ = disc({e})[0];
    DL_ = c.lossGradKept ? 0 : X_[L_];
    for (int i = 0; i < L_; ++i)
      BE_.push_back(disc({c.btmp[i] + (i + 1 == L_ ? lossBytes : e)})[0]);
  }
  virtual ~RotorSlots() = default;

  double tableTime() const { return T(S_ - X_[0], 0, L_); }
  int slots() const { return S_; }
  // A slot is one unit of the chain: the table is exact (no size rounded up).
  bool exact() const { return exact_; }

  std::optional<std::vector<Op>> schedule() const {
    const int m = S_ - X_[0];
    if (m < 0 || T(m, 0, L_) == kInf) return std::nullopt;
    std::vector<Op> ops;
    emit(m, 0, L_, ops);
    return ops;
  }

 protected:
  virtual double T(int m, int i, int l) const = 0;
  // The gradient d[l+1] held in P(i, l, m); d[L] in rows (i, L - 1) as they count it.
  int D(int l) const { return l == L_ ? 0 : l + 1 == L_ ? DL_ : X_[l + 1]; }
  // B_i's d[i+1], tape, d[i] and temporary in row (i, l); in rows (i, L), and what is beside.
  int backwardNeeds(int i, int l) const {
    if (l == L_) return X_[i + 1] + XB_[i + 1] + X_[i] + BE_[i];
    return (i + 1 == L_ ? DL_ : X_[i + 1]) + XB_[i + 1] + X_[i] + BT_[i];
  }
  int lossNeeds() const { return X_[L_] + std::max(BT_[L_], LB_); }  // d[L], then the loss too
  // Row (i, l) reads the rows (i, j - 1) of its leaf moves at m - shift(l).
  int shift(int l) const { return l == L_ ? E_ : 0; }

  // The move the table's value at (m, i, l) came from, found again rather than stored (a
  // choice per entry would be a third of the table): both tables try the moves in one order
  // (the chain, then leaf j = i + 1 ..) and keep a later one only when strictly cheaper, so
  // theirs is the first move worth exactly the value, computed here with the same operations
  // in the same order. -1: the chain; j: leaf j.
  int choiceAt(int m, int i, int l) const {
    const double value = T(m, i, l);
    if (m >= backwardNeeds(i, l) && m >= D(l) + XB_[i + 1] + FE_[i] &&
        c_.ftime[i] + c_.btime[i] + T(m - XB_[i + 1], i + 1, l) == value) {
      return -1;
    }
    double forward = 0;
    int fwdPeak = X_[i + 1] + FT_[i];  // CF_i
    for (int j = i + 1; j <= l; ++j) {
      if (j > i + 1) fwdPeak = std::max(fwdPeak, X_[j - 1] + X_[j] + FT_[j - 1]);  // Fn_{j-1}
      forward += c_.ftime[j - 1];
      if (D(l) + fwdPeak > m) break;
      if (forward + T(m - X_[j], j, l) + T(m - shift(l), i, j - 1) == value) return j;
    }
    throw std::logic_error("rotor: no move makes the table's value at (" + std::to_string(m) +
                           ", " + std::to_string(i) + ", " + std::to_string(l) + ")");
  }

  void emit(int m, int i, int l, std::vector<Op>& ops) const {
    if (i == L_) {
      ops.push_back({Kind::kLoss, 0});
      return;
    }
    if (i == l) {
      ops.push_back({Kind::kForwardEnable, i});
      ops.push_back({Kind::kBackward, i});
      return;
    }
    const int arg = choiceAt(m, i, l);
    if (arg < 0) {
      ops.push_back({Kind::kForwardEnable, i});
      emit(m - XB_[i + 1], i + 1, l, ops);
      ops.push_back({Kind::kBackward, i});
      return;
    }
    for (int k = i; k < arg; ++k) {
      ops.push_back({k == i ? Kind::kForwardCheck : Kind::kForwardNoGrad, k});
    }
    emit(m - X_[arg], arg, l, ops);
    emit(m - shift(l), i, arg - 1, ops);
  }

  const Chain& c_;
  int L_, S_;
  bool exact_;
  std::vector<int> X_, XB_, FT_, FE_, BT_;  // FE_: taped forwards' ftmp
  int LB_ = 0, E_ = 0, DL_ = 0;             // the loss; E (above); d[L] as rows (i, L - 1) count it
  std::vector<int> BE_;  // btmp[i] and what the step holds beside B_i in rows (i, L)
};

// ---- rotor, the reference table ---------------------------------------------------------------
//
// The first implementation, kept as the fast one's reference (tests compare their optima, the
// benchmark their speed): one table indexed (m, i, l), filled entry by entry.

class RotorReference final : public RotorSlots {
 public:
  RotorReference(const Chain& c, double budget, int slots) : RotorSlots(c, budget, slots) {
    table_.assign(static_cast<size_t>(S_ + 1) * (L_ + 1) * (L_ + 1), kInf);
    fill();
  }

 private:
  size_t idx(int m, int i, int l) const {
    return (static_cast<size_t>(m) * (L_ + 1) + i) * (L_ + 1) + l;
  }
  double T(int m, int i, int l) const override { return m < 0 ? kInf : table_[idx(m, i, l)]; }

  void fill() {
    for (int d = 0; d <= L_; ++d) {
      for (int i = 0; i + d <= L_; ++i) {
        const int l = i + d;
        for (int m = 0; m <= S_; ++m) table_[idx(m, i, l)] = cost(m, i, l);
      }
    }
  }

  double cost(int m, int i, int l) {
    if (i == L_) return m >= lossNeeds() ? c_.btime[L_] : kInf;
    const bool backwardFits = m >= backwardNeeds(i, l);
    if (i == l) {
      const bool fits = backwardFits && m >= D(l) + XB_[i + 1] + FE_[i];
      return fits ? c_.ftime[i] + c_.btime[i] : kInf;
    }
    double best = kInf;
    // chain: Fe_i keeps the tape while the rest runs.
    if (backwardFits && m >= D(l) + XB_[i + 1] + FE_[i]) {
      best = std::min(best, c_.ftime[i] + c_.btime[i] + T(m - XB_[i + 1], i + 1, l));
    }
    // leaf j: run to x[j] keeping x[i] and x[j] only.
    double forward = 0;
    int fwdPeak = X_[i + 1] + FT_[i];  // CF_i
    for (int j = i + 1; j <= l; ++j) {
      if (j > i + 1) fwdPeak = std::max(fwdPeak, X_[j - 1] + X_[j] + FT_[j - 1]);  // Fn_{j-1}
      forward += c_.ftime[j - 1];
      if (D(l) + fwdPeak > m) break;  // longer runs only add forwards
      best = std::min(best, forward + T(m - X_[j], j, l) + T(m - shift(l), i, j - 1));
    }
    return best;
  }

  std::vector<double> table_;
};

// ---- rotor --------------------------------------------------------------------------------------
//
// The same program as RotorReference, laid out for the way it is read: one row of S + 1 slot
// values per sub-chain (i, l), i <= l only (half the reference's table). A move's condition on
// m is a threshold (every fit is "m >= some sum"), so each move is one pass over the row's
// slots from its threshold up, reading the rows of two shorter sub-chains at fixed offsets:
// contiguous, branch-free loops the compiler vectorises (kernels below), where the reference
// jumps across slices of its table. A move also starts no lower than where the rows it reads
// become finite (kept per row), and stops where the row is already no more than the move's
// least value (every row is non-increasing in m), which skips the slot counts too small for the
// rest of the chain and those where a longer recomputation cannot pay. Sub-chains of one length
// depend only on shorter ones, so each length's rows are filled in parallel over the cores. The
// value of every entry is the reference's, bit for bit, and so is the move read back from it.
//
// A chain with the step's terms (chain.h) is also planned without them (solveRotor): the two
// programs differ only in rows (i, L - 1) and (i, L), so the second table is those 2L + 1 rows
// over the first's others.

// row[k] = min(row[k], add + a[k]) and min(row[k], add + a[k] + b[k]) for k < n; where the
// compiler can, one clone per vector width, picked at load time by the CPU's features.
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && defined(__gnu_linux__)
#define SB_ROTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef SB_ROTOR_CLONES
#define SB_ROTOR_CLONES
#endif

SB_ROTOR_CLONES void relaxChain(double* __restrict row, const double* __restrict a, double add,
                                int n) {
  for (int k = 0; k < n; ++k) {
    const double t = add + a[k];
    row[k] = t < row[k] ? t : row[k];
  }
}

SB_ROTOR_CLONES void relaxLeaf(double* __restrict row, const double* __restrict a,
                               const double* __restrict b, double add, int n) {
  for (int k = 0; k < n; ++k) {
    const double t = add + a[k] + b[k];
    row[k] = t < row[k] ? t : row[k];
  }
}

class Rotor final : public RotorSlots {
 public:
  using Clock = std::chrono::steady_clock;
  // With `base` (the same chain's table with its step terms, at the same slot count), only the
  // rows (i, L - 1) and (i, L) are this table's own: the others are read from `base`, which must
  // outlive this one.
  Rotor(const Chain& c, double budget, int slots, double maxBytes, Clock::time_point deadline,
        const std::function<void(double)>& progress, const Rotor* base = nullptr)
      : RotorSlots(c, budget, slots), base_(base), deadline_(deadline), progress_(progress) {
    if (base_ && (base_->S_ != S_ || base_->L_ != L_)) {
      throw std::logic_error("rotor: a table shares rows only at the same length and slots");
    }
    row_ = static_cast<size_t>(S_) + 1;
    const double pairs = (L_ + 1.0) * (L_ + 2.0) / 2;
    const double own = base_ ? 2.0 * L_ + 1 : pairs;
    // With the step's terms, the 2L + 1 rows of the table without them come on top.
    const double tail = !base_ && c.stepTermsBound() > 0 ? 2.0 * L_ + 1 : 0;
    const double bytes = rowBytes(row_) * (own + tail);
    if (bytes > maxBytes) {
      throw SolverLimitError("rotor: the table of a " + std::to_string(L_) + "-stage chain at " +
                                 std::to_string(S_) + " slots needs " +
                                 std::to_string(static_cast<int64_t>(bytes)) + " bytes, over the " +
                                 std::to_string(static_cast<int64_t>(maxBytes)) +
                                 " allowed (--max-solver-memory; fewer --slots shrink it)",
                             bytes);
    }
    table_.assign(static_cast<size_t>(own) * row_, kInf);
    first_.assign(static_cast<size_t>(own), S_ + 1);
    least_.assign(static_cast<size_t>(own), kInf);
    fill();
  }

  // Per row: a time per slot count, where the row turns finite, and its least value.
  static double rowBytes(size_t row) {
    return static_cast<double>(row + 1) * sizeof(double) + sizeof(int);
  }

 private:
  // Whether row (i, l) is this table's own (else base_'s).
  bool owns(int l) const { return !base_ || l >= L_ - 1; }
  // This table's own row (i, l): with base_, rows (i, L - 1) then (i, L); without, rows of
  // sub-chains starting at i follow those starting before it.
  size_t rowNumber(int i, int l) const {
    if (base_) return l == L_ ? static_cast<size_t>(L_) + i : static_cast<size_t>(i);
    const size_t before = static_cast<size_t>(i) * (2 * static_cast<size_t>(L_) + 3 - i) / 2;
    return before + static_cast<size_t>(l - i);
  }
  const double* rowOf(int i, int l) const {
    return owns(l) ? &table_[rowNumber(i, l) * row_] : base_->rowOf(i, l);
  }
  double* ownRow(int i, int l) { return &table_[rowNumber(i, l) * row_]; }
  // The row's first slot count with a finite time (S + 1: none): below it a move that reads
  // the row can be skipped outright.
  int first(int i, int l) const { return owns(l) ? first_[rowNumber(i, l)] : base_->first(i, l); }
  // The row's value at S, its least: kept beside first() so that a move's bound needs no read
  // of the rows themselves (scattered over the table, where first_ and least_ are compact).
  double least(int i, int l) const {
    return owns(l) ? least_[rowNumber(i, l)] : base_->least(i, l);
  }
  double T(int m, int i, int l) const override { return m < 0 ? kInf : rowOf(i, l)[m]; }

  void fill() {
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // The work of length d's rows is (L - d + 1) (d + 1) row sweeps: checked against the
    // deadline, and reported, between lengths.
    double total = 0, done = 0;
    for (int d = 0; d <= L_; ++d) total += rowsOfLength(d) * (d + 1.0);
    auto lastReport = Clock::now();
    for (int d = 0; d <= L_; ++d) {
      const auto now = Clock::now();
      if (now > deadline_) {
        char pct[32];
        std::snprintf(pct, sizeof pct, "%.1f%%", 100 * done / total);
        throw SolverTimeLimit("rotor: stopped at the time limit with " + std::string(pct) +
                              " of the table of a " + std::to_string(L_) + "-stage chain at " +
                              std::to_string(S_) +
                              " slots filled (--time-limit; fewer --slots or a shorter chain "
                              "finish sooner)");
      }
      if (progress_ && now - lastReport > std::chrono::seconds(1)) {
        progress_(done / total);
        lastReport = now;
      }
      done += rowsOfLength(d) * (d + 1.0);
      // Threads only where the length's rows are worth waking them for.
      const int rows = L_ - d + 1;
      const double work = rowsOfLength(d) * (d + 1) * static_cast<double>(row_);
      const int n = work > 2e5 ? std::min(threads, rows) : 1;
      if (n <= 1) {
        for (int i = 0; i + d <= L_; ++i) fillRow(i, i + d);
        continue;
      }
      std::vector<std::thread> pool;
      for (int t = 0; t < n; ++t) {
        pool.emplace_back([this, t, n, d] {
          for (int i = t; i + d <= L_; i += n) fillRow(i, i + d);
        });
      }
      for (auto& th : pool) th.join();
    }
  }

  // How many rows of sub-chains of d + 1 stages (the loss counted as one) this table fills.
  double rowsOfLength(int d) const {
    if (!base_) return L_ - d + 1.0;
    return (d >= 1 ? 1.0 : 0.0) + 1.0;  // (L - 1 - d, L - 1) where it exists, and (L - d, L)
  }

  void fillRow(int i, int l) {
    if (!owns(l)) return;
    fillMoves(i, l);
    const double* row = rowOf(i, l);
    int m = 0;
    while (m <= S_ && row[m] == kInf) ++m;
    first_[rowNumber(i, l)] = m;
    least_[rowNumber(i, l)] = row[S_];
  }

  void fillMoves(int i, int l) {
    double* row = ownRow(i, l);
    const int S = S_;
    if (i == L_) {
      for (int m = lossNeeds(); m <= S; ++m) row[m] = c_.btime[L_];
      return;
    }
    const int backward = backwardNeeds(i, l);
    if (i == l) {
      const double t = c_.ftime[i] + c_.btime[i];
      for (int m = std::max(backward, D(l) + XB_[i + 1] + FE_[i]); m <= S; ++m) row[m] = t;
      return;
    }
    // chain: Fe_i keeps the tape while the rest runs.
    {
      const int off = XB_[i + 1];
      const int from = std::max({backward, D(l) + off + FE_[i], off + first(i + 1, l)});
      if (from <= S) {
        relaxChain(row + from, rowOf(i + 1, l) + from - off, c_.ftime[i] + c_.btime[i],
                   S + 1 - from);
      }
    }
    // leaf j: run to x[j] keeping x[i] and x[j] only.
    double forward = 0;
    int fwdPeak = X_[i + 1] + FT_[i];  // CF_i
    const int lastLeaf = gRotorFault == RotorFault::kShortLeafRunsOnly ? std::min(l, i + 2) : l;
    for (int j = i + 1; j <= lastLeaf; ++j) {
      if (j > i + 1) fwdPeak = std::max(fwdPeak, X_[j - 1] + X_[j] + FT_[j - 1]);  // Fn_{j-1}
      forward += c_.ftime[j - 1];
      const int from = D(l) + fwdPeak;
      if (from > S) break;  // longer runs only add forwards
      const int off = X_[j], sh = shift(l);
      const int start = std::max({from, off + first(j, l), sh + first(i, j - 1)});
      if (start > S) continue;
      // Both rows the move reads are non-increasing in m, and so is this one: the move is worth
      // no less than the sum of their least values (kept compact: reading the rows' ends instead
      // would miss the cache on every move). Where the row is already at or below that, the
      // move cannot be strictly cheaper, nor further on.
      const double bound = forward + least(j, l) + least(i, j - 1);
      if (bound >= row[start]) continue;
      const double* after = rowOf(j, l);
      const double* before = rowOf(i, j - 1);
      const int end = static_cast<int>(
          std::partition_point(row + start, row + S + 1, [bound](double v) { return v > bound; }) -
          row);
      if (end > start) {
        relaxLeaf(row + start, after + start - off, before + start - sh, forward, end - start);
      }
    }
  }

  const Rotor* base_;
  Clock::time_point deadline_;
  std::function<void(double)> progress_;
  size_t row_ = 0;
  std::vector<double> table_;
  std::vector<int> first_;
  std::vector<double> least_;
};

// rotor's schedule with the table `make` builds for a budget in bytes (without a budget, what
// keeping every tape peaks at), priced by the simulator. `make(c, b, base)` may read the rows
// the plain chain shares with `base`, the same chain's table with its step terms.
using MakeRotor = std::function<std::unique_ptr<RotorSlots>(const Chain& c, double budget,
                                                            const RotorSlots* base)>;

std::optional<Schedule> solveRotor(const Chain& chain, const SolveOptions& options,
                                   const MakeRotor& make) {
  const int L = chain.length();
  double b = options.budget;
  if (b <= 0) b = simulate(chain, segmentSchedule(L, {0})).peak;  // unconstrained
  if (b <= 0) return priced("rotor", chain, segmentSchedule(L, {0}), options.budget);
  // The table counts the step's terms as the simulator does, so its schedule fits the budget
  // (rounding every size up), and is the fastest of rotor's form that does: nothing to retry.
  auto rotor = make(chain, b, nullptr);
  auto ops = rotor->schedule();
  const bool fromTable = ops.has_value();
  // Unconstrained, rounding every size up may leave no schedule in the slots at keeping every
  // tape's peak: that schedule then, the fastest of all (no table value).
  if (!ops && options.budget <= 0) ops = segmentSchedule(L, {0});
  std::optional<Schedule> s;
  if (ops) s = priced("rotor", chain, std::move(*ops), options.budget);
  if (s && fromTable) s->tableTime = rotor->tableTime();
  // At coarse slots the table rounds every size up, the step's terms with them, and can miss a
  // schedule that fits: the table of the chain without its terms, priced by the simulator with
  // them, sometimes finds a faster one that does (densenet121 at 40% of its peak, 500 slots: 17
  // recomputed forwards against 21). The faster of the two that fits. At one slot per unit the
  // first is exact and optimal, and this cannot win.
  if (chain.stepTermsBound() <= 0 || rotor->exact()) return s;
  if (gRotorFault == RotorFault::kWithoutThePlainTable) return s;
  Chain plain = chain;
  plain.outputKept = false;
  plain.lossGradKept = false;
  plain.lossBytes = 0;
  // Where both have one slot count, the second shares all rows but 2L + 1 with the first;
  // otherwise the first is freed before the second is built (each may take all of
  // --max-solver-memory).
  const bool share = RotorSlots::slotCount(plain, b, options.slots) == rotor->slots();
  if (!share) rotor.reset();
  const auto other = make(plain, b, share ? rotor.get() : nullptr);
  if (auto alt = other->schedule()) {
    auto t = priced("rotor", chain, std::move(*alt), options.budget);
    if (t && (!s || t->predictedTime < s->predictedTime)) {
      t->tableTime = other->tableTime();
      s = std::move(t);
    }
  }
  return s;
}

}  // namespace

std::vector<std::string> Schedule::names() const {
  std::vector<std::string> n;
  for (const auto& op : ops) n.push_back(op.name());
  return n;
}

const std::vector<std::string>& solverNames() {
  static const std::vector<std::string> names = {"none",   "full",    "sqrt",
                                                 "greedy", "revolve", "rotor"};
  return names;
}

std::vector<Op> revolveSchedule(int length, int snapshots) {
  return Revolve(length + 1, snapshots).schedule(length, snapshots);
}

long revolveForwardSteps(int steps, int snapshots) {
  return Revolve(steps, snapshots).forwardSteps(steps, snapshots);
}

std::vector<Op> segmentSchedule(int L, const std::vector<int>& b) {
  if (b.empty() || b.front() != 0 || b.back() >= L || !std::is_sorted(b.begin(), b.end()) ||
      std::adjacent_find(b.begin(), b.end()) != b.end()) {
    throw std::logic_error("segment boundaries must start at 0, increase and stay below L");
  }
  std::vector<int> e = b;
  e.push_back(L);
  const int k = static_cast<int>(b.size());
  std::vector<Op> ops;
  for (int t = 0; t + 1 < k; ++t) {  // keep each segment's input, run to the next one's
    for (int i = e[t]; i < e[t + 1]; ++i) {
      ops.push_back({i == e[t] ? Kind::kForwardCheck : Kind::kForwardNoGrad, i});
    }
  }
  for (int i = e[k - 1]; i < L; ++i) ops.push_back({Kind::kForwardEnable, i});  // last: taped
  ops.push_back({Kind::kLoss, 0});
  for (int t = k - 1; t >= 0; --t) {
    if (t + 1 < k) {
      for (int i = e[t]; i < e[t + 1]; ++i) ops.push_back({Kind::kForwardEnable, i});
    }
    for (int i = e[t + 1] - 1; i >= e[t]; --i) ops.push_back({Kind::kBackward, i});
  }
  return ops;
}

std::optional<Schedule> solve(const std::string& solver, const Chain& chain,
                              const SolveOptions& options) {
  chain.validate();
  const int L = chain.length();
  const double budget = options.budget;
  if (solver == "none") return priced(solver, chain, segmentSchedule(L, {0}), budget);
  if (solver == "full") {
    std::vector<int> all(L);
    for (int i = 0; i < L; ++i) all[i] = i;
    return priced(solver, chain, segmentSchedule(L, all), budget);
  }
  if (solver == "sqrt") return priced(solver, chain, segmentSchedule(L, sqrtBoundaries(L)), budget);
  if (solver == "greedy") {
    // Every threshold that changes the segmentation is a sum of consecutive tapes.
    std::set<double> thresholds = {0.0};
    for (int a = 1; a <= L; ++a) {
      double s = 0;
      for (int e = a; e <= L; ++e) thresholds.insert(s += chain.xbar[e]);
    }
    std::set<std::vector<int>> seen;
    std::vector<std::vector<Op>> candidates;
    for (double t : thresholds) {
      auto b = greedyBoundaries(chain, t);
      if (seen.insert(b).second) candidates.push_back(segmentSchedule(L, b));
    }
    return fastestFitting(solver, chain, candidates, budget);
  }
  if (solver == "revolve") {
    std::vector<std::vector<Op>> candidates;
    Revolve revolve(L + 1, L);
    for (int s = 0; s <= L; ++s) candidates.push_back(revolve.schedule(L, s));
    return fastestFitting(solver, chain, candidates, budget);
  }
  if (solver == "rotor") {
    if (options.slots < 1) throw ChainError("rotor: --slots must be at least 1");
    // One deadline for every table this solve fills.
    const auto deadline =
        options.timeLimitSec > 0
            ? Rotor::Clock::now() + std::chrono::duration_cast<Rotor::Clock::duration>(
                                        std::chrono::duration<double>(options.timeLimitSec))
            : Rotor::Clock::time_point::max();
    return solveRotor(chain, options, [&](const Chain& c, double b, const RotorSlots* base) {
      return std::make_unique<Rotor>(
          c, b, options.slots,
          options.maxSolverBytes > 0 ? options.maxSolverBytes : defaultSolverBytes(), deadline,
          options.progress, static_cast<const Rotor*>(base));
    });
  }
  std::string known;
  for (const auto& n : solverNames()) known += (known.empty() ? "" : ", ") + n;
  throw ChainError("unknown checkpoint solver '" + solver + "' (known: " + known + ")");
}

std::optional<Schedule> solveRotorReference(const Chain& chain, const SolveOptions& options) {
  chain.validate();
  // The reference shares nothing: its second table is the plain chain's whole program.
  return solveRotor(chain, options, [&](const Chain& c, double b, const RotorSlots*) {
    return std::make_unique<RotorReference>(c, b, options.slots);
  });
}

double defaultSolverBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || size <= 0) return 4.0 * (1 << 30);
  return static_cast<double>(pages) * static_cast<double>(size) / 4;
}

ScopedRotorFault::ScopedRotorFault(RotorFault fault) : previous_(gRotorFault) {
  gRotorFault = fault;
}
ScopedRotorFault::~ScopedRotorFault() { gRotorFault = previous_; }

}  // namespace sb::strategies::checkpointing
