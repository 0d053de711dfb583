#pragma once

// Small pieces the sharding executors share.

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "harness/case.h"
#include "harness/comm/comm.h"

namespace sb::strategies {

// A strategy's name as its id spells it: "S0S1 = S0R x RS1" -> "S0S1=S0R.RS1" (regex-friendly
// and free of spaces).
inline std::string compactName(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 3, " x ") == 0) {
      out += '.';
      i += 2;
    } else if (name[i] != ' ') {
      out += name[i];
    }
  }
  return out;
}

// The total of a per-group communication prediction (Strategy::predictCommByGroup).
inline harness::CommStats totalComm(
    const std::vector<std::pair<std::vector<int>, harness::CommStats>>& byGroup) {
  harness::CommStats total;
  for (const auto& [axes, st] : byGroup) {
    for (int i = 0; i < harness::kNumCollectives; ++i) {
      total.entries[i].calls += st.entries[i].calls;
      total.entries[i].bytes += st.entries[i].bytes;
    }
  }
  return total;
}

// A training case's communication by group (`steps: N`), from one step's `byGroup`: the loss
// (in the dtype) and the gradient norm's squares (float64) all-reduced over the whole mesh each
// step where it has more than one rank, and everything N times.
inline void addTrainingComm(std::vector<std::pair<std::vector<int>, harness::CommStats>>& byGroup,
                            const harness::CaseSpec& c) {
  if (!c.training.enabled()) return;
  if (c.meshSize() > 1) {
    std::vector<int> all(c.mesh.size());
    for (size_t a = 0; a < all.size(); ++a) all[a] = static_cast<int>(a);
    harness::CommStats st;
    st.add(harness::Collective::kAllReduce, static_cast<int64_t>(c10::elementSize(c.dtype)));
    st.add(harness::Collective::kAllReduce, 8);
    byGroup.emplace_back(all, st);
  }
  for (auto& [axes, stats] : byGroup) {
    for (auto& e : stats.entries) {
      e.calls *= c.training.steps;
      e.bytes *= c.training.steps;
    }
  }
}

// The same per node (Strategy::predictCommByNode): every node's collectives N times over a
// case's steps, and the loss's and the gradient norm's all-reduces each step, outside the nodes
// in the update.
inline void addTrainingComm(std::vector<harness::NodeComm>& nodes, const harness::CaseSpec& c) {
  if (!c.training.enabled()) return;
  for (auto& n : nodes) n.comm.scale(c.training.steps);
  if (c.meshSize() > 1) {
    harness::NodeComm update{"", "update", {}};
    for (int k = 0; k < c.training.steps; ++k) {
      update.comm.add(harness::Collective::kAllReduce,
                      static_cast<int64_t>(c10::elementSize(c.dtype)));
      update.comm.add(harness::Collective::kAllReduce, 8);
    }
    nodes.push_back(std::move(update));
  }
}

// The peak of a recorded allocation sequence: `tokens` is one "+NAME" (allocation) or "-NAME"
// (release) per event, NAME a key of `size`; `start` the bytes alive when the sequence begins.
// Throws (internal error) on an unknown name or a sequence that does not return to `start`.
inline int64_t replayAllocations(const char* tokens, const std::map<std::string, int64_t>& size,
                                 int64_t start) {
  int64_t current = start, peak = start;
  std::istringstream in(tokens);
  std::string t;
  while (in >> t) {
    const auto it = size.find(t.substr(1));
    TORCH_INTERNAL_ASSERT(it != size.end(), "allocation sequence token ", t);
    current += t[0] == '+' ? it->second : -it->second;
    peak = std::max(peak, current);
  }
  TORCH_INTERNAL_ASSERT(current == start, "the allocation sequence does not balance");
  return peak;
}

}  // namespace sb::strategies
