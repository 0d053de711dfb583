#pragma once

// Test-only: a deliberate mispricing of one step kind by the redistribution planner, for the
// planted-fault test of the check that prices every step against what the threads backend
// counts when it runs (test/redistribute_price_test.cpp). Not part of the layout library's API:
// nothing but that test includes this header, and without it the planner prices truly.

namespace sb::harness {

enum class PriceFault {
  kNone,
  // stepBytes prices a reduce-scatter by the piece each rank keeps instead of the full input
  // the Communicator counts: plans stay valid, the planner's choices are misled.
  kReduceScatterPricedByOutput,
  // RedistCostModel::stepUs times an all-gather by each rank's input instead of the gathered
  // output the Communicator counts.
  kAllGatherTimedByInput,
};

// Sets the planner's pricing fault for the scope's lifetime, process-wide (tests run one at a
// time; the planner reads it on the calling thread).
class ScopedPriceFault {
 public:
  explicit ScopedPriceFault(PriceFault fault);
  ~ScopedPriceFault();
  ScopedPriceFault(const ScopedPriceFault&) = delete;
  ScopedPriceFault& operator=(const ScopedPriceFault&) = delete;

 private:
  PriceFault previous_;
};

}  // namespace sb::harness
