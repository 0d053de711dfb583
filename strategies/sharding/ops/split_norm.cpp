// SplitNorm's memory replay (split_norm.h), beside the autograd function it follows.

#include "strategies/sharding/ops/split_norm.h"

namespace sb::strategies {

void splitNormReplay(MemoryReplay& m, int64_t R, int64_t W) {
  const int64_t X = m.X, O = m.O;
  harness::Communicator* comm = nullptr;
  if (!m.r.statAxes.empty() && m.fault != "skip_stats_all_reduce") {
    comm = &m.ctx.group(m.r.statAxes);
  }
  const auto sc = [&](int64_t b) { return comm ? m.scratch(m.r.statAxes, b) : 0; };
  m.alloc(R);  // sum
  m.alloc(sc(R));
  m.release(sc(R));
  m.alloc(X);  // xhat
  m.release(R);
  m.alloc(X);  // squares
  m.alloc(R);  // their sum: rstd
  m.release(X);
  m.alloc(sc(R));
  m.release(sc(R));
  m.alloc(O);  // y
  m.backwardBegins();
  m.alloc(X);          // g
  m.alloc(R + X + R);  // sum(g), g * xhat, its sum
  m.alloc(2 * R);      // cat
  m.release(R + X + R);
  m.alloc(sc(2 * R));
  m.release(sc(2 * R));
  m.alloc(X);  // dx
  m.release(X + 2 * R);
  m.alloc(X + W);  // dy * xhat, its sum
  m.release(X);
  m.alloc(W);        // db
  m.release(X + R);  // the saved xhat and rstd
  m.gradAllReduces();
}

}  // namespace sb::strategies
