#pragma once

// One value of a step, named by where it was made: what a failing row's first divergence is
// located with (harness/run/divergence.h). A strategy lists its reference run's values in
// execution order (Strategy::referenceTrace); its executors, with capture on, keep their pieces
// of the same values under the same names (RankExecutor::captured).

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
  std::string key() const { return phase + "|" + tensor; }
};

}  // namespace sb::harness
