#pragma once

// What an FSDP / ZeRO strategy decides before it runs (fsdp.cpp runs it): which state each kind
// shards, how a case's ranks divide the batch and the state, the graph's units and where each
// one's forward ends, and the communication that follows from them, predicted per collective.
// Shared by the strategy (its prediction) and the executor (its plan), which must agree.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/case.h"
#include "harness/comm/comm.h"
#include "reference/graph.h"

namespace sb::strategies::fsdp {

enum class Kind { kDdp, kZero1, kZero2, kZero3, kHsdp };

// Deliberate bugs for the planted-fault tests (fsdp.cpp says what each does).
enum class Fault {
  kNone,
  kGradDividedTwice,
  kStaleShard,
  kHsdpWrongAxis,
  kReplicaUnsummed,
  kReplicaOwnOrder,
  kUnitNotResharded,
  kRankSkipsUpdate
};
inline constexpr Fault kFaults[] = {Fault::kGradDividedTwice, Fault::kStaleShard,
                                    Fault::kHsdpWrongAxis,    Fault::kReplicaUnsummed,
                                    Fault::kReplicaOwnOrder,  Fault::kUnitNotResharded,
                                    Fault::kRankSkipsUpdate};

const char* kindName(Kind k);    // "ddp", "zero1", ...
const char* faultName(Fault f);  // "grad_divided_twice", ...
// Every kind takes the general faults; the replica faults where there are replicas.
bool takesFault(Kind k, Fault f);

// `params: {reshard_after_forward: false}` (zero3, hsdp): a unit's gathered parameters stay
// from its forward through its backward, not gathered a second time (FSDP2's option; the root
// is always kept). Default true.
bool reshardAfterForward(const harness::CaseSpec& c);
// `params: {prefetch: N}` (zero3, hsdp): the N units after a unit gathered with it before its
// forward, and the N before it (their backwards come next) with it before its backward, as
// FSDP2's forward / backward prefetch; default 0. -1 where the value is not a whole number in
// 0..8.
int prefetchDepth(const harness::CaseSpec& c);
// `params: {param_dtype: bfloat16}` (zero3, hsdp; a float32 case): FSDP2's mixed precision,
// units gathered and computed in bfloat16, gradients reduced in float32 into float32 shards
// that the optimizer steps. The case's dtype where absent; nullopt where not a dtype it takes.
std::optional<at::ScalarType> paramDtype(const harness::CaseSpec& c);

// Why FSDP cannot train the imported model (workload torchscript) of `c` on its ranks, or ""
// where it can: each rank runs the model imported at its rows of the batch (rankShape), so
// every input's first dimension must be the batch and divide over the ranks, the model must
// import at that size into the same graph, its output's first dimension must be the batch, and
// no operator may mix the rows (batch norm's statistics over the batch are not the sum of the
// ranks'). Micro-batches are the pipeline's reference, not a data-parallel step.
std::string importedUnsupported(const harness::CaseSpec& c);
// The shape of one data-parallel rank's slice of the case's batch (every rank the same number
// of rows): a graph workload's batch over `ranks`; an imported model's every input's first
// dimension over `ranks`.
nlohmann::json rankShape(const harness::CaseSpec& c, int ranks);

inline bool shardsParams(Kind k) { return k == Kind::kZero3 || k == Kind::kHsdp; }
inline bool shardsState(Kind k) { return k != Kind::kDdp; }
inline bool shardsGrads(Kind k) { return k == Kind::kZero2 || shardsParams(k); }

// How a case's ranks divide the work: the batch over every rank; the state over the shard
// group (hsdp: mesh axis 1; the others: every rank).
struct Layout {
  int world = 1;
  int shardParts = 1;    // ranks a parameter is sharded over
  int shardIndex = 0;    // this rank's shard
  int replicaParts = 1;  // hsdp: replicas of each shard (mesh axis 0)
  static Layout of(Kind k, const harness::CaseSpec& c, int rank);
};

// The graph's units: one per block (its layer), and the root (every parameter read outside
// the blocks, or by more than one block). Per unit beside the root, where its forward ends and
// what it hands on: the values it produced that later nodes read (or the output), whose
// gradients arriving mean its backward is next.
struct Units {
  std::vector<std::string> names;                // "root", "layer0", ...
  std::vector<int> layer;                        // per unit: its layer, -1 for the root
  std::vector<std::vector<std::string>> params;  // per unit
  std::map<std::string, int> unitOfParam;
  std::vector<int> lastNode;                       // per unit: its last node (-1: none)
  std::vector<std::vector<std::string>> handedOn;  // per unit (the root's: empty)
  static Units of(const reference::Graph& g);
};

// The block units (not the root) in the order their forwards run: by their first node.
std::vector<int> forwardOrder(const Units& u, const reference::Graph& g);

// Elements of each row (dims 1..) of a parameter, and of the whole.
int64_t rowElems(const std::vector<int64_t>& dims);
int64_t numel(const std::vector<int64_t>& dims);

// Calls and bytes of every collective rank `rank` issues over the case's steps.
harness::CommStats predictComm(Kind kind, Fault fault, const harness::CaseSpec& c, int rank);
// The same per unit ("root", "layer0", ...) and phase: a sharded unit's gathers in its forward,
// its gathers again and reductions in its backward; replicated parameters' reductions (and
// ZeRO's gathers of updated shards) in the update, at their unit; the loss and the norm in the
// update, outside the units (node "").
std::vector<harness::NodeComm> predictCommByNode(Kind kind, Fault fault, const harness::CaseSpec& c,
                                                 int rank);

}  // namespace sb::strategies::fsdp
