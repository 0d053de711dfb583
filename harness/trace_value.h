#pragma once

// One value of a step, named by where it was made: what a failing row's first divergence is
// located with (harness/run/divergence.h). A strategy lists its reference run's values
// (Strategy::referenceTrace); its executors, with capture on, keep their pieces of the same
// values under the same names, in the order they made them, with the time (RankExecutor::
// captured).

#include <chrono>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "harness/box.h"

namespace sb::harness {

struct TraceValue {
  // The graph node, layer or stage whose computation made the value ("h0.attn.q"); a gradient
  // is made by the backward of the node that completes it.
  std::string node;
  std::string phase;   // "forward", "backward" or "recompute"
  std::string tensor;  // "h0.attn.q", "h0.ln1 -> h0.attn.q[0]", "grad h0.attn.q", "grad wte"
  // Reference: the whole value. Captured: this rank's piece, at `box` of the whole value, with
  // pending sums already reduced.
  at::Tensor value;
  Box box;
  // Captured: when it was made, by the wall clock (clockNs), so that ranks' first divergences
  // are ordered in time: a value made from a wrong one another rank sent is made after it.
  int64_t atNs = 0;
  std::string key() const { return phase + "|" + tensor; }
  static int64_t clockNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace sb::harness
