#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::strategies::checkpointing {

// A linearized network in the notation of rotor (Beaumont et al., "Optimal checkpointing for
// heterogeneous chains", 2019): L stages F_0 .. F_{L-1} and a loss.
//
//   x[i]     size of the input of stage i; x[0] is the network input, x[L] the loss input
//   xbar[i]  size of everything stage i-1 leaves for its backward when run keeping its tape
//            (its output x[i] included); xbar[0] is unused and conventionally x[0]
//   ftime[i] forward time of stage i               (L values)
//   btime[i] backward time of stage i; btime[L] is the loss, forward and backward (L + 1)
//   ftmp[i]  memory stage i's forward needs besides its input and output        (L)
//   fetmp[i] optional: the same for its taped forward (Fe_i), where it differs from the
//            untaped ones' (CF_i, Fn_i): autograd keeps some temporaries as the tape, and
//            no-grad kernels may take other paths. Absent: ftmp serves both        (L)
//   btmp[i]  memory stage i's backward needs besides what it reads and writes   (L + 1)
//
// Sizes are in any unit (bytes for measured chains); times too (microseconds when measured).
//
// Two optional terms describe the training step the chain runs in, beyond rotor's model
// (which frees x[L] at the loss and d[L] at B_{L-1}); a measured chain sets both, a chain
// without them is rotor's model exactly:
//   output_kept  the step keeps the network's output x[L] and the loss to the end: after the
//                loss, x[L] stays held (where it is held inside xbar[L], its bytes stay when
//                B_{L-1} frees the rest of the tape), and `loss_bytes` more (the loss value and
//                the gradient the backward is seeded with)
//   loss_grad_kept  d[L] stays held until the step ends (the chain runs as one autograd node,
//                whose incoming gradient the engine holds until the node's backward returns)
struct Chain {
  std::vector<double> ftime, btime, x, xbar, ftmp, btmp;
  std::vector<double> fetmp;  // empty: ftmp
  bool outputKept = false;
  double lossBytes = 0;
  bool lossGradKept = false;

  int length() const { return static_cast<int>(ftime.size()); }
  double taped(int i) const { return fetmp.empty() ? ftmp[i] : fetmp[i]; }  // Fe_i's ftmp
  // The most the two step terms add to rotor's peak at any point: what they hold from B_{L-1}
  // to the end (E in solvers.cpp, where rotor's table counts them exactly).
  double stepTermsBound() const {
    return (outputKept ? x.back() + lossBytes : 0) + (lossGradKept ? x.back() : 0);
  }
  // Throws ChainError when the lengths do not fit together or a value is negative or not finite.
  void validate(const std::string& where = "chain") const;
  nlohmann::json toJson() const;
  // Reads the keys ftime, btime, x, xbar, ftmp, btmp (and optionally fetmp, output_kept,
  // loss_bytes, loss_grad_kept); errors name the key and index.
  static Chain fromJson(const nlohmann::json& j, const std::string& where = "chain");
};

class ChainError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// rotor's operations:
//   CF_i  forward of stage i keeping its input x[i] and only its output x[i+1]  ("check")
//   Fn_i  forward of stage i keeping nothing: x[i] is freed, x[i+1] kept          ("no grad")
//   Fe_i  forward of stage i keeping its tape: xbar[i+1] kept, x[i] kept          ("enable")
//   L     the loss, forward and backward: reads x[L], writes its gradient d[L]
//   B_i   backward of stage i: reads d[i+1], xbar[i+1] and x[i]; writes d[i]; frees the
//         first two, and x[i] where it is held on its own (not as part of xbar[i])
struct Op {
  enum class Kind { kForwardCheck, kForwardNoGrad, kForwardEnable, kLoss, kBackward };
  Kind kind;
  int stage = 0;
  std::string name() const;                  // "CF_3", "Fn_4", "Fe_2", "L", "B_0"
  static Op parse(const std::string& name);  // throws ChainError
  bool isForward() const { return kind != Kind::kLoss && kind != Kind::kBackward; }
  bool operator==(const Op& o) const { return kind == o.kind && stage == o.stage; }
};

// What running a schedule on a chain costs, under rotor's memory model: every value held is
// counted from when its operation starts to when an operation frees it; an operation also
// holds its temporary memory while it runs.
struct Simulation {
  bool valid = false;
  std::string problem;  // why a schedule is not valid: the first operation that cannot run
  double time = 0;
  double peak = 0;             // the budget of a valid schedule must be at least this
  int recomputedForwards = 0;  // forwards beyond one per stage
  // What is held after each operation besides x[0], in the order of `ops`: the executor
  // measures the same after each operation it runs (the bytes over the step's start, where
  // x[0], the network's input, is live throughout: its caller holds it whether or not the
  // schedule still does), so a value kept past the operation that frees it (a leak the peak
  // may not show) is flagged where it happens.
  std::vector<double> heldAfter;
};

// Replays `ops` from "x[0] held" to "d[0] produced, nothing else held": every operation's
// inputs must be held, every stage's backward run once, in order, after the loss.
Simulation simulate(const Chain& chain, const std::vector<Op>& ops);

}  // namespace sb::strategies::checkpointing
