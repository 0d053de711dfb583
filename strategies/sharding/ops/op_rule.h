#pragma once

// One operator's sharding rule (PyTorch DTensor's `_ops/`): everything that differs from one
// operator to the next, in one place, registered by the operator's name. The generic strategy,
// its executor and its models (op_sharding.cpp, op_strategies.h) ask the rule of the case's
// operator for each part instead of testing the operator's name.
//
// Each family of operators has a file of its own under strategies/sharding/ops/ (addmm.cpp,
// matmul.cpp, ...) that fills an OpRule per operator and registers it at its bottom with
// SB_REGISTER_OP_RULE. Every part is required: registration throws naming the operator and the
// part left empty. An operator also has its place in kOpOrder (op_rule.cpp), the order
// `stratbench list` shows the operators' canonical strategies in; registering a name not in
// it, or a name twice, is a hard error.
//
// Static initialisation: the registry is a function-local static, so a registrar may run
// before any other. The canonical strategies are registered (op_sharding.cpp) once every
// operator of kOpOrder has its rule, whichever file's initialisation completes the set; a
// family file therefore keeps its state in functions or constants, never in a dynamically
// initialised global above its registrar that another file's generator could read too early.

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "harness/registry.h"
#include "strategies/sharding/ops/op_strategies.h"

namespace sb::strategies {

// What an operator's forward sees on one rank (runOp): its local operands, with the gradient
// all-reduces of the operands already inserted, and the communication its layouts require.
struct LocalForward {
  const ResolvedOp& r;
  harness::RankContext& ctx;
  const std::vector<at::Tensor>& in;  // the local operands, in the reference's order
  uint64_t seed;                      // seeds dropout
  const std::string& fault;           // the planted fault, "" for none
  // The statistics' group, or none when the planted fault skips their all-reduce.
  harness::Communicator* statComm;
  std::vector<int64_t> coords, mesh;

  // Output `out`'s all-reduce of its pending sums (identity in the backward), unless there are
  // none or the planted fault skips it.
  at::Tensor reduce(const at::Tensor& y, size_t out = 0) const;
  // This rank's box of operand i.
  harness::Box operandBox(size_t i) const;
};

// The allocation replay of one rank's step (OpExecutor::modelPeak; op_sharding.cpp's file
// comment): bytes above the step's start, where the prepared operands and gradient seeds are
// alive. An operator's part allocates and releases in the order its step does.
struct MemoryReplay {
  MemoryReplay(const ResolvedOp& r_, harness::RankContext& ctx_, const std::string& fault_,
               at::ScalarType dtype_, const std::vector<at::Tensor>& leaves_,
               const std::vector<harness::Box>& outputBoxes_, const std::vector<int>& outPartial_)
      : r(r_),
        ctx(ctx_),
        fault(fault_),
        dtype(dtype_),
        leaves(leaves_),
        outputBoxes(outputBoxes_),
        outPartial(outPartial_) {}

  const ResolvedOp& r;
  harness::RankContext& ctx;
  const std::string& fault;
  at::ScalarType dtype;
  const std::vector<at::Tensor>& leaves;         // the local operands
  const std::vector<harness::Box>& outputBoxes;  // this rank's boxes of the outputs
  const std::vector<int>& outPartial;            // the first output's pending-sum axes
  int64_t es = 0;                                // the element size
  int64_t statEs = 0;      // CPU kernels keep statistics in float for float and the 16-bit types
  int64_t X = 0;           // the first operand's bytes
  int64_t n = 0;           // the first operand's elements
  int64_t O = 0;           // the outputs' bytes
  std::vector<int64_t> g;  // per operand: its gradient's bytes, 0 without one
  int64_t sumG = 0;
  bool reduces = false;  // they are all-reduced (not skipped by the planted fault)

  void alloc(int64_t b) {
    current += b;
    peak = std::max(peak, current);
    if (split && b != 0) events.push_back(b);
  }
  void release(int64_t b) {
    current -= b;
    if (split && b != 0) events.push_back(-b);
  }
  // Where the operator's backward begins: every rule calls it once, after its forward's last
  // allocation. The whole-plan replay (auto-sharding's plan_memory.cpp) runs one rule per node
  // with `split` set, which records the events, and places the forward's and the backward's
  // between the other nodes' as the autograd engine runs them.
  // With `split` set, the rule's dropPreviousResults and gradAllReduces do nothing: the plan
  // keeps no previous results, and its partial gradients' all-reduces are nodes of their own.
  void backwardBegins() {
    ++backwardMarks;
    if (!split) return;
    forwardNet = current;
    backwardFrom = events.size();
  }
  // Where the gradients of the operator's outputs and what its first backward node saved are
  // released, when the operator's backward is several nodes (softmax's scale and mask): the
  // engine frees them after that node. By default, after the operator's last.
  void incomingReleased() {
    if (split) incomingReleasedAt = events.size();
  }
  bool split = false;
  size_t incomingReleasedAt = SIZE_MAX;
  std::vector<int64_t> events;  // with `split`: every allocation (> 0) and release (< 0)
  size_t backwardFrom = 0;      // the backward's first event
  int64_t forwardNet = 0;       // bytes the forward keeps
  int backwardMarks = 0;        // a rule calls backwardBegins() once (the plan replay checks)
  // The backend's scratch for an all-reduce of `b` bytes over `axes` (none over one rank).
  int64_t scratch(const std::vector<int>& axes, int64_t b) const;
  // The previous step's results are alive when the window opens and are dropped first: its
  // outputs and gradients, less those that are views (of the input, of the gradient seed).
  void dropPreviousResults(bool outputsAreViews, bool gradientsAreViews);
  // A partial output's all-reduce: a copy, reduced through the backend's scratch; the local
  // result is a temporary that goes when the reduction returns.
  void reduceCopy();
  // After the operator's backward node: each partial gradient is all-reduced through a copy,
  // which replaces it.
  void gradAllReduces();
  // A FULLY REPLICATED strategy's gather of its input (OpStrategySpec::gatherInput): the
  // redistribution's steps, each step's output and the backend's scratch (RedistRunner::memory);
  // the whole input stays, as the output is a view of it. Nothing over a group of one.
  void gatherInput();
  // Whether the strategy gathers its input over more than one rank.
  bool gathersInput() const;

  int64_t current = 0, peak = 0;
};

// One operator's parts. Each is required (registerOpRule checks).
struct OpRule {
  // The shapes whose strategies `stratbench list` shows (registered up front), in order.
  std::function<std::vector<nlohmann::json>()> canonicalShapes;
  // Every strategy of the operator for operands of the ranks of the shape, in the generator's
  // order (opStrategySpecs).
  std::function<std::vector<OpStrategySpec>(const reference::OpShape&)> specs;
  // The layouts for the case, where the operator changes the generator's (resolveOp): view
  // maps its input's shards to its output. Sets r.problem when they cannot run. keepLayouts
  // for the rest.
  std::function<void(ResolvedOp& r, const harness::DeviceMesh& mesh)> layouts;
  // Every fault plantable in a strategy (OpStrategy::plantableFaults): usually
  // commonFaults(spec, {the operator's own}).
  std::function<std::vector<std::string>(const OpStrategySpec&)> faults;
  // One rank's forward on its pieces, with its forward all-reduces (runOp).
  std::function<std::vector<at::Tensor>(const LocalForward&)> forward;
  // The step's allocations, forward and backward (OpExecutor::modelPeak).
  std::function<void(MemoryReplay&)> memory;
  // Floating-point operations of this rank's products, forward and backward (opFlops);
  // noFlops for operators without products.
  std::function<double(const ResolvedOp&, const std::vector<int64_t>& mesh, int rank)> flops;
  // The statistics one rank all-reduces, given its box of the input (opCommByGroup), for
  // operators whose statistics can span ranks; noStatistics for the rest.
  std::function<int64_t(const harness::Box& input)> statistics;
  // The length of the longest sum the reference computes an element of `tensor` (an output or
  // "grad_<operand>") with, for products and convolutions (OpStrategy::tolerance): a rank sums
  // the same terms through a kernel on other shapes, in another order. 0 where the operator
  // computes each element as the reference does (noReduction).
  std::function<int64_t(const reference::OpShape& s, const std::string& tensor)> reductionLength;
};

// The rule of `op`; throws naming the operators there are rules for when there is none.
const OpRule& opRule(const std::string& op);
// Registers `rule` for `op`: throws for a name registered already, a name not in kOpOrder or
// an empty part, naming the operator and the part.
void registerOpRule(const std::string& op, OpRule rule);
// The operators in the order `stratbench list` shows them (kOpOrder, op_rule.cpp).
const std::vector<std::string>& opOrder();
// Runs `f` once every operator of kOpOrder has its rule: now if they have, otherwise when the
// last one registers.
void whenOpRulesComplete(std::function<void()> f);

struct OpRuleRegistrar {
  OpRuleRegistrar(const std::string& op, OpRule rule) { registerOpRule(op, std::move(rule)); }
};
// Registers the rule `rule` (an OpRule) for the operator named `op`, at the bottom of its file.
#define SB_REGISTER_OP_RULE(op, rule) \
  static const ::sb::strategies::OpRuleRegistrar SB_CONCAT(sbOpRule_, __COUNTER__)(op, rule)

// Parts that several operators share.
// The layouts as the generator made them.
void keepLayouts(ResolvedOp& r, const harness::DeviceMesh& mesh);
// The faults every operator's strategies can plant, the operator's own (`own`) between them,
// in this order: a skipped output all-reduce where an output holds pending sums, the
// operator's own, a skipped gradient all-reduce where an operand's gradient holds partial sums
// (not counting `noGradient`, an operand without a gradient: embedding's ids).
std::vector<std::string> commonFaults(const OpStrategySpec& spec,
                                      const std::vector<std::string>& own, int noGradient = -1);
// The operators that compute on their pieces exactly as on the whole tensor: the reference's
// forward on the local operands.
std::vector<at::Tensor> referenceForward(const LocalForward& f);
double noFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank);
// For operators without statistics over ranks: never asked (an internal error if it is).
int64_t noStatistics(const harness::Box& input);
// For operators whose elements are not sums of products: 0.
int64_t noReduction(const reference::OpShape& s, const std::string& tensor);
// [.., M, K] x [K, N] (addmm, bmm, matmul): the output sums K terms, the input's gradient N,
// the other operand's and the bias's every row of the input (M, times the batch).
int64_t productReductionLength(const reference::OpShape& s, const std::string& tensor);

// The axes over which operand i's gradient holds partial sums (see op_strategies.h).
std::vector<int> gradPartialOf(const OpStrategySpec& spec,
                               const std::vector<harness::Layout>& operands,
                               const std::vector<harness::Layout>& outputs, size_t i);
// Every mesh axis a layout uses, pending sums included, sorted.
std::vector<int> usedAxes(const harness::Layout& l);

}  // namespace sb::strategies
