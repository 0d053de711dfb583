#pragma once

// What this LibTorch's autograd engine does that a memory model must not assume, probed once
// per process rather than encoded for one version (docs/pytorch2.md). Implemented beside the
// engine's wrapper (autograd_engine.cpp).

namespace sb::reference {

// Whether a second gradient of one tensor is added into the first in place. Where two gradients
// of one tensor meet in the engine's input buffer, LibTorch 1.13 adds them into a new tensor;
// 2.x adds one into the other where the buffer holds the only reference to it, and allocates
// nothing. A model that replays a backward allocation by allocation (context parallelism's,
// strategies/sharding/cp/cp_memory.cpp) asks this. Probed on a leaf used twice: the summed
// gradient's address is one of the two branches' or not.
bool autogradSumsGradientsInPlace();

}  // namespace sb::reference
