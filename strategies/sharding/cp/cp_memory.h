#pragma once

// The memory model of one context-parallel step (context_parallel.cpp): every allocation and
// release of a rank's step, in order, as sizes of its tensors, replayed on a counter whose
// peak is the step's peak above what was live when it began (cp_memory.cpp).

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/comm/comm.h"
#include "strategies/sharding/cp/sequence_attention.h"

namespace sb::strategies::cp {

struct CpStepSizes {
  Variant variant = Variant::kRingP2P;
  Fault fault = Fault::kNone;
  bool training = false, causal = false;
  int64_t batch = 0, seq = 0, dModel = 0, heads = 0, layers = 0;
  int64_t w = 1, tp = 1;  // ranks on the ring (mesh axis 0) and tensor-parallel ranks (axis 1)
  int64_t ringRank = 0;   // this rank's place on the ring
  int64_t es = 4;         // bytes per element
  // ring/p2p: per source rank, whether this rank's queries see any of its keys; ring/allgather:
  // the same per block of T / w keys in position order (SequenceAttention::visible).
  std::vector<bool> visible;
  // The bytes a collective allocates besides its result (Communicator::scratchBytes) on the
  // ring's axis and the tensor-parallel axis: (collective, this rank's block, the largest).
  std::function<int64_t(harness::Collective, int64_t, int64_t)> cpScratch, tpScratch;
};

// One allocation (+) or release (-) of the replay, with what it is.
struct CpMemoryEvent {
  int64_t bytes;
  const char* what;
};

// The step's peak bytes above those live at its start. `log`: every event, in order, where
// given (SB_MEMORY_TRACE prints it beside the measured trace).
int64_t cpStepPeak(const CpStepSizes& s, std::vector<CpMemoryEvent>* log = nullptr);

}  // namespace sb::strategies::cp
